"""synth_harmony_v1-shaped frames from bare prompts: what the near-duplicate signature step reads, built without
the raw -> harmony pass (tests/test_near_dup.py's planted prompts, benchmarks/near_dup.py's million rows)."""

from __future__ import annotations

import json

import polars as pl


def harmony_frame(rows: list[dict]) -> pl.DataFrame:
    """Rows of (synth_id, prompt, optional exercise and constraints) -> synth_harmony_v1 columns: messages_json
    holds [system, user = the prompt, final]."""

    def messages(prompt: str) -> str:
        text = lambda t: [{"type": "text", "text": t}]  # noqa: E731
        return json.dumps(
            {
                "messages": [
                    {"role": "system", "content": text("system")},
                    {"role": "user", "content": text(prompt)},
                    {"role": "assistant", "channel": "final", "content": text("answer")},
                ]
            }
        )

    return pl.DataFrame(
        {
            "synth_id": [r["synth_id"] for r in rows],
            "language": ["en"] * len(rows),
            "exercise": [r.get("exercise", "memorization") for r in rows],
            "source_row": list(range(len(rows))),
            "messages_json": [messages(r["prompt"]) for r in rows],
            "metadata_json": [json.dumps({"constraints": r.get("constraints", "")}) for r in rows],
        }
    )
