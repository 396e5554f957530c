"""synthkd_contract: the synth_kd_v1 contract, shared by the build (synthkd_assets) and training (synthkd_training).

- `constants`: every value that shapes the output bytes (tokenizer pin, dtypes, names, salts, caps);
- `schemas`: the Arrow schema of every table;
- `drops`: every drop and sanitization reason, with what it means, by step;
- `labels`: how per-token spans become the stored, label-aligned loss mask and span ids;
- `trio`: how a shard's tokens / lossmask / span files are named, and `validate_trio`;
- `indexed_dataset`: megatron-core's IndexedDataset files written and read with numpy alone (byte for byte what
  megatron-core's builder writes; the files its reader opens);
- `manifest_seal`: verifying a dataset against its sealed `manifest.json`;
- `buckets`: the 002 pool's rules as data: exercise -> skill bucket, ctx-bucket bounds, skill mix, quota salt,
  pool ids and curriculum stages (`skill_bucket`, `ctx_bucket`);
- `sources`: the 002 source mix: anchor categories and their token shares, source -> dataset / category, caps.

Nothing here imports dagster or synthkd_assets; megatron-core (and torch) load only when `trio.open_trio` opens a
trio for training: writing and validating one needs neither.
"""
