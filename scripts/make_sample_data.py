#!/usr/bin/env python
"""Deterministic generator of bundled sample input in the raw PleIAs/SYNTH schema.

Writes ``--shards`` Parquet files ``synth_00.parquet`` ... into ``--output-dir`` (default
``data/sample/synth_raw``), ``--rows-per-shard`` rows each, with exactly the upstream columns
(``synthkd_contract.schemas.RAW_SCHEMA``): every column ``string`` except ``words`` (``int64``).

The rows imitate SYNTH, including the messy parts the pipeline must cope with: ~20 % non-English
rows (fr, de, es, it, pl, nl, la), a memorization majority, mcq / arithmetic rows whose
``constraints`` carry a ``result:<value>`` (usually consistent with the answer's first line,
sometimes formatted differently, ~5 % deliberately inconsistent), ``result:Failed after maximum
attempts`` rows, empty / whitespace-only reasoning and answers, CJK, emoji (ZWJ sequences
included), literal Harmony marker text and NUL characters.

Determinism: every row ``i`` (global index) is drawn from its own ``random.Random((seed << 40) |
i)``, so a row does not depend on how rows are split into shards, nothing reads the clock or
``hash()``, and the Parquet files are written with fixed options (zstd, fixed row-group size, no
pandas metadata): two runs give byte-identical files for a given pyarrow version.

``--long`` makes seed text, reasoning and answer longer (about 1.3k o200k tokens per row on
average) for benchmarks; it is off for the committed sample.

Public API: ``generate_rows(n_rows, seed, start_index=0, long=False)`` and
``write_shards(output_dir, shards, rows_per_shard, seed, long=False)``.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from synthkd_contract.constants import RAW_COLUMNS  # noqa: E402
from synthkd_contract.schemas import RAW_SCHEMA  # noqa: E402

DEFAULT_OUTPUT_DIR = REPO_ROOT / "data" / "sample" / "synth_raw"
DEFAULT_SHARDS = 4
DEFAULT_ROWS_PER_SHARD = 750
DEFAULT_SEED = 1234
ROW_GROUP_SIZE = 256
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 3


def shard_filename(shard_index: int) -> str:
    return f"synth_{shard_index:02d}.parquet"


# ---------------------------------------------------------------------------------------------
# banks
# ---------------------------------------------------------------------------------------------

NON_ENGLISH = ("fr", "de", "es", "it", "pl", "nl", "la")
NON_ENGLISH_FRACTION = 0.20

EXERCISES = (
    ("memorization", 0.62),
    ("rag", 0.10),
    ("mcq", 0.08),
    ("arithmetic", 0.08),
    ("creative_writing", 0.04),
    ("editing", 0.04),
    ("constrained_writing", 0.04),
)

MODELS = (
    ("Qwen3-8B", 0.30),
    ("Qwen3-32B", 0.25),
    ("Qwen3-235B-A22B", 0.20),
    ("Mistral-Small-3", 0.15),
    ("Mistral-Small-3.1", 0.05),
    ("Qwen2.5-72B-Instruct", 0.05),
)

SCRIPTS = {
    "memorization": ("memorization_v3.py", "memorization_multilingual_v2.py"),
    "rag": ("rag_grounded_v2.py", "rag_multi_seed_v1.py"),
    "mcq": ("mcq_generator_v4.py",),
    "arithmetic": ("arithmetic_word_problems_v2.py", "math_verify_loop_v1.py"),
    "creative_writing": ("creative_writing_v1.py",),
    "editing": ("editing_rewrite_v2.py",),
    "constrained_writing": ("constrained_writing_v3.py",),
}

LICENSES = (
    ("CC-BY-SA 4.0", 0.80),
    ("CC-BY-SA 3.0", 0.12),
    ("CC0 1.0", 0.04),
    ("Public Domain", 0.04),
)

TITLES = (
    "Photosynthesis", "Roman Republic", "Kraków", "Zürich", "São Paulo", "Łódź", "Málaga",
    "Gödel's incompleteness theorems", "Marie Curie", "Printing press", "Hanseatic League",
    "Plate tectonics", "Byzantine Empire", "Ada Lovelace", "Danube", "Mitochondrion",
    "Renaissance", "Silk Road", "Thermodynamics", "Baroque music", "Meiji Restoration",
    "Industrial Revolution", "Amazon rainforest", "Johannes Kepler", "Black Death",
    "Periodic table", "Carolingian Empire", "Coral reef", "Leonardo da Vinci", "Vulcanology",
    "Treaty of Westphalia", "Antonín Dvořák", "Fjord", "Natural selection", "Aqueduct",
    "Bronze Age", "Nicolaus Copernicus", "Monsoon", "Enlightenment", "Gothic architecture",
    "Quantum mechanics", "Erasmus of Rotterdam", "Papyrus", "Glacier", "Ottoman Empire",
    "Fibonacci sequence", "Frédéric Chopin", "Wadden Sea", "Cervantes", "Hydrogen",
    "Venetian Republic", "Tundra", "Euclidean geometry", "Maria Skłodowska", "Lagoon",
    "Polish–Lithuanian Commonwealth", "Old Norse", "Tokugawa shogunate", "Vaccination",
    "Cathedral of Notre-Dame", "Alhambra", "Rhine", "Latin literature", "Great Barrier Reef",
)

FIELDS = (
    "history", "biology", "geography", "physics", "mathematics", "art history", "economics",
    "linguistics", "chemistry", "musicology", "political science", "astronomy", "geology",
)
PLACES = (
    "Europe", "the Mediterranean", "Central Asia", "South America", "the Baltic region",
    "East Asia", "the Low Countries", "the Iberian Peninsula", "Scandinavia", "North Africa",
)
PEOPLE = (
    "contemporary chroniclers", "later historians", "modern researchers", "early naturalists",
    "nineteenth-century scholars", "local authorities", "several commentators",
)
ADJECTIVES = (
    "significant", "lasting", "controversial", "well-documented", "remarkable", "gradual",
    "decisive", "complex", "widespread", "influential",
)

SEED_SENTENCES = (
    "{title} is a subject of {adj} interest in {field}.",
    "The earliest records concerning {title} date from around {year}.",
    "According to {people}, the development of {title} was shaped by conditions in {place}.",
    "By {year2}, {title} had become a standard reference point for work in {field}.",
    "Estimates of its extent vary, but most sources give a figure of roughly {num} units.",
    "The term itself entered common usage during the {century} century.",
    "Its influence spread across {place} and, to a lesser degree, {place2}.",
    "Critics have argued that the popular account of {title} overstates its {adj} character.",
    "A major survey published in {year2} revised several earlier assumptions.",
    "{title} is often compared with similar phenomena described in {field}.",
    "The topic remains debated because the primary sources are fragmentary.",
    "Several institutions in {place} maintain archives related to {title}.",
    "Its study combines methods from {field} and {field2}.",
    "During the {century} century the subject attracted the attention of {people}.",
    "Modern interpretations emphasise continuity rather than abrupt change.",
    "The standard classification distinguishes at least {small} main varieties.",
    "Some of the best-known examples are preserved in museums across {place}.",
    "The debate about its origins was largely settled by evidence collected after {year2}.",
    "Quantitative studies suggest a growth rate of about {pct} percent per decade.",
    "It is mentioned in textbooks on {field} as a classic illustration of {adj} change.",
    "In the {century} century, travellers from {place2} described {title} in some detail.",
    "The name is sometimes spelled differently in older sources.",
    "Excavations and archival work have added considerably to what is known.",
    "A number of disputes about dating were resolved in the {century} century.",
    "{title} has also appeared in literature, painting and, more recently, film.",
    "Economic factors played an important part in its growth.",
    "Researchers in {field2} have proposed alternative explanations.",
    "Local traditions in {place} preserve several versions of its early history.",
    "The most cited monograph on {title} runs to more than {small}00 pages.",
    "Public interest in {title} increased sharply after {year2}.",
)

EN = {
    "queries": {
        "memorization": (
            "What is {title}?",
            "Can you explain the history of {title}?",
            "Why is {title} considered important in {field}?",
            "Give me an overview of {title} and its significance.",
            "how did {title} develop over time",
            "What are the main facts I should know about {title}?",
        ),
        "rag": (
            "Using only the reference text, summarize what it says about {title}.",
            "According to the passage, when did {title} become prominent?",
            "Based on the provided source, what are the key features of {title}?",
        ),
        "creative_writing": (
            "Write a short poem inspired by {title}.",
            "Write a brief story in which a student discovers {title}.",
            "Compose a diary entry of someone living at the time of {title}.",
        ),
        "editing": (
            "Fix the grammar and style of this paragraph: \"{title} are a topic what many "
            "peoples studies in {field} since long time.\"",
            "Rewrite the following text in a more formal register: \"{title} is basically "
            "super important for {field}, like, really.\"",
        ),
        "constrained_writing": (
            "Describe {title} in exactly three sentences, without using the word \"very\".",
            "Explain {title} to a ten-year-old in fewer than 80 words.",
            "Write a haiku-style summary of {title}, then list two facts.",
        ),
    },
    "mcq_stem": "Which of the following statements about {title} is correct?",
    "arith_int": (
        "An archive related to {title} holds {a} documents and acquires {b} more each year. "
        "How many documents will it hold after {n} years?"
    ),
    "arith_dec": (
        "A shipment of {total} kg of material for a {title} exhibition is split equally "
        "into {n} crates. How many kilograms go into each crate?"
    ),
    "reasoning": (
        "The user is asking about {title}, so I should start by recalling the basic facts.",
        "The reference passage mentions {year}, which gives me a useful anchor for the timeline.",
        "I need to be careful not to overstate the certainty of the early sources.",
        "Let me organise the answer: definition first, then history, then significance.",
        "There is a possible confusion between {title} and related topics in {field}.",
        "The passage also says its influence reached {place}, which is worth including.",
        "I should check whether the numbers are consistent with each other.",
        "A short markdown structure with a heading and a bullet list should work well here.",
        "Wait, the question might be about the modern interpretation rather than the origins.",
        "On reflection, both aspects can be covered briefly without making the answer too long.",
        "The key point is that {title} is {adj} for {field}.",
        "I will mention the debate among {people} but keep it neutral.",
        "Now let me double-check the dates before writing the final answer.",
        "The user probably wants a clear, well-structured explanation rather than a list of trivia.",
    ),
    "answer": (
        "{title} is best understood as a {adj} topic within {field}.",
        "Its earliest documented traces go back to around {year}.",
        "Over time, its influence extended across {place}.",
        "Scholars such as {people} have debated its exact origins.",
        "Today it is taught as a classic example in {field}.",
        "The available evidence points to gradual rather than sudden development.",
        "Several important collections are kept in {place}.",
        "Its study draws on methods from {field} and {field2}.",
    ),
    "headings": ("Overview", "Key points", "Summary", "Historical context", "Why it matters"),
    "answer_intro": "In short:",
    "table_head": ("Aspect", "Detail"),
    "table_rows": ("First attested", "Main region", "Field", "Character"),
}

# one small bank per non-English language (text really in that language)
LANG = {
    "fr": {
        "queries": (
            "Qu'est-ce que {title} ?",
            "Peux-tu m'expliquer l'histoire de {title} ?",
            "Pourquoi {title} est-il considéré comme important en {field} ?",
            "Donne-moi un résumé détaillé sur {title}, s'il te plaît.",
        ),
        "mcq_stem": "Laquelle des affirmations suivantes sur {title} est correcte ?",
        "arith_int": "Une bibliothèque possède {a} livres sur {title} et en achète {b} chaque "
        "année. Combien en aura-t-elle après {n} ans ?",
        "arith_dec": "On répartit {total} kg de matériel entre {n} caisses identiques. "
        "Combien de kilogrammes par caisse ?",
        "reasoning": (
            "L'utilisateur me demande des informations sur {title} ; je dois d'abord rappeler "
            "les faits essentiels.",
            "Le texte de référence mentionne l'année {year}, ce qui donne un repère chronologique.",
            "Il faut éviter d'exagérer la certitude des sources anciennes.",
            "Je vais structurer la réponse : définition, histoire, puis importance.",
            "Attention à ne pas confondre {title} avec des notions voisines.",
            "La réponse doit être en français, claire et bien organisée.",
            "Vérifions encore une fois les dates avant de rédiger la réponse finale.",
            "Son influence s'est étendue à toute la région, ce qui mérite d'être souligné.",
        ),
        "answer": (
            "{title} est un sujet très étudié, notamment en histoire et en géographie.",
            "Les premières traces connues remontent à l'année {year} environ.",
            "Son influence s'est étendue bien au-delà de sa région d'origine.",
            "Les spécialistes ne sont pas tous d'accord sur ses origines exactes.",
            "Aujourd'hui, on l'étudie comme un exemple classique de développement progressif.",
            "Plusieurs musées conservent des collections importantes à ce sujet.",
            "Il s'agit d'un thème à la fois complexe et passionnant.",
        ),
        "headings": ("Présentation", "Points clés", "Résumé", "Contexte historique"),
        "answer_intro": "En résumé :",
        "table_head": ("Aspect", "Détail"),
        "table_rows": ("Première mention", "Région principale", "Domaine", "Caractère"),
    },
    "de": {
        "queries": (
            "Was ist {title}?",
            "Kannst du mir die Geschichte von {title} erklären?",
            "Warum gilt {title} als wichtig für die Wissenschaft?",
            "Gib mir bitte einen Überblick über {title}.",
        ),
        "mcq_stem": "Welche der folgenden Aussagen über {title} ist richtig?",
        "arith_int": "Ein Archiv über {title} besitzt {a} Dokumente und erhält jedes Jahr {b} "
        "weitere. Wie viele Dokumente sind es nach {n} Jahren?",
        "arith_dec": "{total} kg Material werden gleichmäßig auf {n} Kisten verteilt. "
        "Wie viele Kilogramm kommen in jede Kiste?",
        "reasoning": (
            "Der Nutzer fragt nach {title}, also sollte ich zuerst die wichtigsten Fakten "
            "zusammentragen.",
            "Der Referenztext nennt das Jahr {year}, das ist ein guter Anhaltspunkt.",
            "Ich muss vorsichtig sein und die Unsicherheit der frühen Quellen erwähnen.",
            "Die Antwort gliedere ich in Definition, Geschichte und Bedeutung.",
            "Es besteht Verwechslungsgefahr mit ähnlichen Begriffen, das sollte ich klären.",
            "Die Antwort muss auf Deutsch sein, gut strukturiert und nicht zu lang.",
            "Bevor ich antworte, überprüfe ich noch einmal die Jahreszahlen.",
            "Außerdem ist der Einfluss auf die Nachbarregionen erwähnenswert.",
        ),
        "answer": (
            "{title} ist ein vielfach untersuchtes Thema der Geschichte und Naturkunde.",
            "Die ältesten bekannten Belege stammen etwa aus dem Jahr {year}.",
            "Sein Einfluss reichte weit über die Ursprungsregion hinaus.",
            "Über die genaue Herkunft sind sich die Fachleute nicht einig.",
            "Heute gilt es als klassisches Beispiel für eine allmähliche Entwicklung.",
            "Mehrere Museen bewahren bedeutende Sammlungen dazu auf.",
            "Die Straße der Forschung ist lang, und große Fragen sind noch offen.",
        ),
        "headings": ("Überblick", "Wichtige Punkte", "Zusammenfassung", "Historischer Kontext"),
        "answer_intro": "Kurz gesagt:",
        "table_head": ("Aspekt", "Einzelheit"),
        "table_rows": ("Erste Erwähnung", "Hauptregion", "Fachgebiet", "Charakter"),
    },
    "es": {
        "queries": (
            "¿Qué es {title}?",
            "¿Puedes explicarme la historia de {title}?",
            "¿Por qué se considera importante {title}?",
            "Dame un resumen sobre {title}, por favor.",
        ),
        "mcq_stem": "¿Cuál de las siguientes afirmaciones sobre {title} es correcta?",
        "arith_int": "Un archivo sobre {title} tiene {a} documentos y recibe {b} más cada año. "
        "¿Cuántos documentos tendrá después de {n} años?",
        "arith_dec": "Se reparten {total} kg de material en {n} cajas iguales. "
        "¿Cuántos kilogramos van en cada caja?",
        "reasoning": (
            "El usuario pregunta por {title}, así que primero debo recordar los datos básicos.",
            "El texto de referencia menciona el año {year}, lo cual sirve de punto de partida.",
            "Debo tener cuidado de no exagerar la fiabilidad de las fuentes antiguas.",
            "Organizaré la respuesta: definición, historia y, por último, importancia.",
            "Hay que distinguir {title} de otros conceptos parecidos.",
            "La respuesta debe estar en español y ser clara para el usuario.",
            "Antes de contestar, compruebo otra vez las fechas y las cifras.",
            "También conviene señalar su influencia en la región vecina.",
        ),
        "answer": (
            "{title} es un tema muy estudiado en la historia y en las ciencias naturales.",
            "Los primeros testimonios conocidos datan aproximadamente del año {year}.",
            "Su influencia se extendió mucho más allá de su región de origen.",
            "Los especialistas no coinciden del todo sobre su origen exacto.",
            "Hoy se enseña como un ejemplo clásico de desarrollo gradual.",
            "Varios museos españoles conservan colecciones importantes sobre el tema.",
            "La investigación continúa y todavía quedan preguntas sin resolver.",
        ),
        "headings": ("Introducción", "Puntos clave", "Resumen", "Contexto histórico"),
        "answer_intro": "En resumen:",
        "table_head": ("Aspecto", "Detalle"),
        "table_rows": ("Primera mención", "Región principal", "Campo", "Carácter"),
    },
    "it": {
        "queries": (
            "Che cos'è {title}?",
            "Puoi spiegarmi la storia di {title}?",
            "Perché {title} è considerato così importante?",
            "Fammi un riassunto su {title}, per favore.",
        ),
        "mcq_stem": "Quale delle seguenti affermazioni su {title} è corretta?",
        "arith_int": "Un archivio su {title} contiene {a} documenti e ne riceve {b} ogni anno. "
        "Quanti documenti conterrà dopo {n} anni?",
        "arith_dec": "Si dividono {total} kg di materiale in {n} casse uguali. "
        "Quanti chilogrammi vanno in ogni cassa?",
        "reasoning": (
            "L'utente chiede informazioni su {title}, quindi devo prima richiamare i fatti "
            "principali.",
            "Il testo di riferimento cita l'anno {year}, utile come punto di riferimento.",
            "Devo fare attenzione a non esagerare l'affidabilità delle fonti più antiche.",
            "Organizzerò la risposta così: definizione, storia e infine importanza.",
            "Bisogna distinguere {title} da concetti simili.",
            "La risposta deve essere in italiano, chiara e ben strutturata.",
            "Prima di rispondere, ricontrollo le date e le cifre.",
            "Vale la pena menzionare anche la sua influenza sulle regioni vicine.",
        ),
        "answer": (
            "{title} è un argomento molto studiato nella storia e nelle scienze naturali.",
            "Le prime testimonianze note risalgono all'incirca al {year}.",
            "La sua influenza si è estesa ben oltre la regione d'origine.",
            "Gli studiosi non sono tutti d'accordo sulle sue origini esatte.",
            "Oggi viene insegnato come esempio classico di sviluppo graduale.",
            "Diversi musei conservano collezioni importanti su questo tema.",
            "La ricerca prosegue e restano ancora domande aperte.",
        ),
        "headings": ("Panoramica", "Punti chiave", "Riepilogo", "Contesto storico"),
        "answer_intro": "In breve:",
        "table_head": ("Aspetto", "Dettaglio"),
        "table_rows": ("Prima attestazione", "Regione principale", "Campo", "Carattere"),
    },
    "pl": {
        "queries": (
            "Czym jest {title}?",
            "Czy możesz wyjaśnić historię {title}?",
            "Dlaczego {title} uważa się za ważny temat?",
            "Proszę o krótkie streszczenie na temat {title}.",
        ),
        "mcq_stem": "Które z poniższych zdań o {title} jest prawdziwe?",
        "arith_int": "Archiwum poświęcone {title} ma {a} dokumentów i co roku otrzymuje {b} "
        "nowych. Ile dokumentów będzie miało po {n} latach?",
        "arith_dec": "{total} kg materiału dzieli się równo na {n} skrzyń. "
        "Ile kilogramów trafi do każdej skrzyni?",
        "reasoning": (
            "Użytkownik pyta o {title}, więc najpierw przypomnę sobie najważniejsze fakty.",
            "Tekst źródłowy wspomina rok {year}, co daje dobry punkt odniesienia.",
            "Muszę uważać, żeby nie przeceniać wiarygodności najstarszych źródeł.",
            "Odpowiedź ułożę tak: definicja, historia, a na końcu znaczenie.",
            "Trzeba odróżnić {title} od podobnych pojęć.",
            "Odpowiedź powinna być po polsku, jasna i dobrze zorganizowana.",
            "Zanim odpowiem, jeszcze raz sprawdzę daty i liczby.",
            "Warto też wspomnieć o wpływie na sąsiednie regiony, zwłaszcza na Łódź i Gdańsk.",
        ),
        "answer": (
            "{title} to temat szeroko badany w historii i naukach przyrodniczych.",
            "Najstarsze znane świadectwa pochodzą mniej więcej z roku {year}.",
            "Jego wpływ sięgnął daleko poza region pochodzenia.",
            "Specjaliści nie są zgodni co do jego dokładnego pochodzenia.",
            "Dziś uczy się o nim jako o klasycznym przykładzie stopniowego rozwoju.",
            "Kilka muzeów przechowuje ważne zbiory związane z tym tematem.",
            "Badania wciąż trwają, a wiele pytań pozostaje bez odpowiedzi.",
        ),
        "headings": ("Przegląd", "Najważniejsze punkty", "Podsumowanie", "Kontekst historyczny"),
        "answer_intro": "Krótko mówiąc:",
        "table_head": ("Aspekt", "Szczegół"),
        "table_rows": ("Pierwsza wzmianka", "Główny region", "Dziedzina", "Charakter"),
    },
    "nl": {
        "queries": (
            "Wat is {title}?",
            "Kun je de geschiedenis van {title} uitleggen?",
            "Waarom wordt {title} als belangrijk beschouwd?",
            "Geef me een kort overzicht van {title}, alsjeblieft.",
        ),
        "mcq_stem": "Welke van de volgende uitspraken over {title} is juist?",
        "arith_int": "Een archief over {title} bevat {a} documenten en krijgt er elk jaar {b} "
        "bij. Hoeveel documenten zijn het na {n} jaar?",
        "arith_dec": "{total} kg materiaal wordt gelijk verdeeld over {n} kisten. "
        "Hoeveel kilogram gaat er in elke kist?",
        "reasoning": (
            "De gebruiker vraagt naar {title}, dus ik moet eerst de belangrijkste feiten "
            "ophalen.",
            "De referentietekst noemt het jaar {year}, dat is een handig ankerpunt.",
            "Ik moet oppassen de zekerheid van vroege bronnen niet te overdrijven.",
            "Ik orden het antwoord: definitie, geschiedenis en daarna betekenis.",
            "Het is belangrijk {title} te onderscheiden van verwante begrippen.",
            "Het antwoord moet in het Nederlands zijn, helder en overzichtelijk.",
            "Voordat ik antwoord, controleer ik de jaartallen nog een keer.",
            "De invloed op de omliggende gebieden verdient ook een vermelding.",
        ),
        "answer": (
            "{title} is een veelbestudeerd onderwerp in de geschiedenis en natuurwetenschap.",
            "De oudste bekende sporen dateren van ongeveer {year}.",
            "De invloed reikte tot ver buiten de regio van herkomst.",
            "Deskundigen zijn het niet eens over de precieze oorsprong.",
            "Tegenwoordig wordt het onderwezen als klassiek voorbeeld van geleidelijke "
            "ontwikkeling.",
            "Verschillende musea bewaren belangrijke collecties over dit onderwerp.",
            "Het onderzoek gaat door en er blijven vragen open.",
        ),
        "headings": ("Overzicht", "Belangrijkste punten", "Samenvatting", "Historische context"),
        "answer_intro": "Kortom:",
        "table_head": ("Aspect", "Detail"),
        "table_rows": ("Eerste vermelding", "Hoofdregio", "Vakgebied", "Karakter"),
    },
    "la": {
        "queries": (
            "Quid est {title}?",
            "Explica mihi, quaeso, historiam de {title}.",
            "Cur {title} tanti momenti habetur?",
            "Da mihi brevem summam de {title}.",
        ),
        "mcq_stem": "Quae ex sententiis sequentibus de {title} vera est?",
        "arith_int": "Tabularium de {title} {a} documenta habet et quotannis {b} nova accipit. "
        "Quot documenta post {n} annos habebit?",
        "arith_dec": "{total} chiliogrammata materiae in {n} cistas aequales dividuntur. "
        "Quot chiliogrammata in singulas cistas?",
        "reasoning": (
            "Usor de {title} quaerit; primum res praecipuas in memoriam revocare debeo.",
            "Textus fontis annum {year} memorat, quod tempus bene definit.",
            "Cavendum est ne fontibus antiquissimis nimiam fidem tribuam.",
            "Responsum sic ordinabo: definitio, historia, deinde momentum.",
            "Oportet {title} a notionibus similibus distinguere.",
            "Responsum Latine scribendum est, clare et ordinate.",
            "Antequam respondeam, annos numerosque iterum inspicio.",
            "Etiam vis eius in regiones finitimas commemoranda est.",
        ),
        "answer": (
            "{title} res est a multis doctis diligenter investigata.",
            "Prima testimonia nota circa annum {year} exstant.",
            "Vis eius longe ultra regionem originis pervenit.",
            "Docti de origine eius accurata non consentiunt.",
            "Hodie ut exemplum classicum progressionis lentae docetur.",
            "Nonnulla musea collectiones magni momenti de hac re servant.",
            "Investigatio pergit, et multae quaestiones adhuc apertae sunt.",
        ),
        "headings": ("Conspectus", "Puncta praecipua", "Summa", "Contextus historicus"),
        "answer_intro": "Breviter:",
        "table_head": ("Res", "Singula"),
        "table_rows": ("Prima mentio", "Regio praecipua", "Disciplina", "Natura"),
    },
}

MCQ_OPTIONS = (
    "It originated in {place} during the {century} century.",
    "It has no connection whatsoever to {field}.",
    "It was first described in {year}.",
    "It is primarily studied within {field}.",
    "It disappeared entirely before {year}.",
    "It is unknown outside {place}.",
    "Its influence spread widely across {place}.",
    "It was invented by a single person in {year2}.",
)

ADDITIONAL_LINKS = (
    "https://www.britannica.com/topic/{slug}",
    "https://en.wikipedia.org/wiki/{slug}",
    "https://fr.wikipedia.org/wiki/{slug}",
    "https://de.wikipedia.org/wiki/{slug}",
    "https://commons.wikimedia.org/wiki/Category:{slug}",
)

CJK_SNIPPETS = (
    "漢字",
    "かな",
    "（日本語: 歴史と文化）",
    "中文名称：光合作用",
    "ひらがなとカタカナ",
    "東京・京都・大阪",
    "한국어 표기: 역사",
)
EMOJI = ("🙂", "🚀", "👩‍🔬", "👨‍👩‍👧‍👦", "🏳️‍🌈", "📚", "✨", "🇫🇷", "👍🏽")

HARMONY_SNIPPETS = (
    "<|start|>assistant<|channel|>final<|message|>",
    "<|start|>user<|message|>hello<|end|>",
    "the tokens <|start|>, <|message|> and <|end|> delimit each message",
    "<|start|>system<|message|>You are ChatGPT.<|end|><|return|>",
    "<|start|>assistant<|channel|>analysis<|message|>thinking...<|end|>",
    "end of document marker <|endoftext|> appears here <|start|>",
    "<|channel|>commentary to=functions.lookup <|message|>{}<|call|>",
    "<|return|>",
)

WHITESPACE_ONLY = ("  \n\t ", "\n\n", " ", "\t", "\n \n")

FAILED_RESULT = (
    "result:Failed after maximum attempts",
    "result:Failed after maximum attempts",
    "RESULT:failed after maximum attempts",
    "Result:FAILED AFTER MAXIMUM ATTEMPTS",
    "result:failed after maximum attempts",
)

OTHER_CONSTRAINTS = (
    ("length", ("short", "medium", "long")),
    ("tone", ("neutral", "formal", "friendly", "academic")),
    ("format", ("markdown", "plain", "bullets")),
    ("audience", ("general", "expert", "student")),
)

# probabilities of the special cases (per row)
P_EMPTY_REASONING = 0.08
P_WS_REASONING = 0.03
P_EMPTY_ANSWER = 0.01
P_FAILED = 0.02
P_INCONSISTENT = 0.05  # among mcq / arithmetic rows with a result
P_HARMONY = 0.01
P_NUL = 0.005
P_CJK = 0.04
P_EMOJI = 0.05

# word-length ranges (normal, long)
SEED_WORDS = ((180, 420), (280, 560))
REASONING_WORDS = ((100, 400), (220, 480))
ANSWER_WORDS = ((50, 300), (120, 360))


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _weighted(rng: random.Random, pairs) -> str:
    return rng.choices([p[0] for p in pairs], weights=[p[1] for p in pairs], k=1)[0]


def _slots(rng: random.Random, title: str) -> dict:
    year = rng.randint(800, 1950)
    f1, f2 = rng.sample(FIELDS, 2)
    p1, p2 = rng.sample(PLACES, 2)
    return {
        "title": title,
        "field": f1,
        "field2": f2,
        "place": p1,
        "place2": p2,
        "people": rng.choice(PEOPLE),
        "adj": rng.choice(ADJECTIVES),
        "year": year,
        "year2": min(year + rng.randint(10, 300), 2023),
        "century": rng.choice(("twelfth", "fifteenth", "seventeenth", "eighteenth",
                               "nineteenth", "twentieth")),
        "num": f"{rng.randint(1, 900) * 100:,}",
        "small": rng.randint(2, 9),
        "pct": rng.randint(2, 40),
    }


def _fill(rng: random.Random, template: str, slots: dict) -> str:
    # re-draw a few slots per sentence so long texts do not repeat verbatim
    local = dict(slots)
    local["adj"] = rng.choice(ADJECTIVES)
    local["people"] = rng.choice(PEOPLE)
    return template.format(**local)


def _n_words(text: str) -> int:
    return len(text.split())


class _Deck:
    """Draws from a bank without replacement, reshuffling when exhausted (fewer repeats)."""

    def __init__(self, rng: random.Random, bank) -> None:
        self.rng = rng
        self.bank = list(bank)
        self.pool: list[str] = []

    def draw(self) -> str:
        if not self.pool:
            self.pool = self.bank[:]
            self.rng.shuffle(self.pool)
        return self.pool.pop()


def _paragraphs(rng: random.Random, bank, slots: dict, target_words: int,
                per_par=(2, 5)) -> str:
    deck = _Deck(rng, bank)
    pars: list[str] = []
    total = 0
    while total < target_words:
        k = rng.randint(*per_par)
        sents = [_fill(rng, deck.draw(), slots) for _ in range(k)]
        par = " ".join(sents)
        pars.append(par)
        total += _n_words(par)
    return "\n\n".join(pars)


def _slug(title: str) -> str:
    return title.replace(" ", "_")


def _fmt_int(value: int, commas: bool) -> str:
    return f"{value:,}" if commas else str(value)


def _fmt_tenths(tenths: int, trailing_zero: bool = False) -> str:
    whole, frac = divmod(tenths, 10)
    if frac == 0 and not trailing_zero:
        return str(whole)
    s = f"{whole}.{frac}"
    return s + "0" if trailing_zero else s


def _markdown_answer(rng: random.Random, bank: dict, slots: dict, target_words: int,
                     code_bias: float = 0.0) -> str:
    deck = _Deck(rng, bank["answer"])
    parts: list[str] = []
    if rng.random() < 0.75:
        level = rng.choice(("##", "###", "#"))
        parts.append(f"{level} {rng.choice(bank['headings'])}: {slots['title']}")
    intro = " ".join(_fill(rng, deck.draw(), slots) for _ in range(rng.randint(1, 3)))
    intro = intro.replace(slots["title"], f"**{slots['title']}**", 1)
    parts.append(intro)
    bullets = []
    for _ in range(rng.randint(3, 6)):
        s = _fill(rng, deck.draw(), slots)
        if rng.random() < 0.5:
            if slots["title"] in s:
                s = s.replace(slots["title"], f"**{slots['title']}**", 1)
            else:
                s = f"**{s.rstrip('.')}**."
        bullets.append(("- " if rng.random() < 0.8 else "* ") + s)
    parts.append(f"{bank['answer_intro']}\n\n" + "\n".join(bullets))
    if rng.random() < 0.15:
        h1, h2 = bank["table_head"]
        r = bank["table_rows"]
        rows = [
            f"| {h1} | {h2} |",
            "|---|---|",
            f"| {r[0]} | {slots['year']} |",
            f"| {r[1]} | {slots['place']} |",
            f"| {r[2]} | {slots['field']} |",
            f"| {r[3]} | {slots['adj']} |",
        ]
        parts.append("\n".join(rows))
    if rng.random() < 0.06 + code_bias:
        parts.append(
            "```python\n"
            f"events = {{'{_slug(slots['title'])}': {slots['year']}}}\n"
            "for name, year in sorted(events.items()):\n"
            "    print(f\"{name}: {year}\")\n"
            "```"
        )
    text = "\n\n".join(parts)
    while _n_words(text) < target_words:
        par = " ".join(_fill(rng, deck.draw(), slots) for _ in range(rng.randint(2, 4)))
        text += "\n\n" + par
    return text


def _insert_at_word(rng: random.Random, text: str, snippet: str) -> str:
    words = text.split(" ")
    pos = rng.randint(0, len(words))
    words.insert(pos, snippet)
    return " ".join(words)


# ---------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------


def _make_row(seed: int, index: int, long: bool) -> dict:
    rng = random.Random((seed << 40) | index)
    li = 1 if long else 0

    language = rng.choice(NON_ENGLISH) if rng.random() < NON_ENGLISH_FRACTION else "en"
    exercise = _weighted(rng, EXERCISES)
    model = _weighted(rng, MODELS)
    title = rng.choice(TITLES)
    slots = _slots(rng, title)
    bank = EN if language == "en" else LANG[language]
    en_bank = EN

    # --- seed ---------------------------------------------------------------------------
    wiki_lang = language if (language != "en" and language != "la" and rng.random() < 0.3) else "en"
    query_seed_url = f"https://{wiki_lang}.wikipedia.org/wiki/{_slug(title)}"
    query_seed_text = _paragraphs(rng, SEED_SENTENCES, slots, rng.randint(*SEED_WORDS[li]),
                                  per_par=(3, 6))
    if rng.random() < 0.55:
        additional_seed_url = ""
    else:
        other = rng.choice(TITLES)
        links = [rng.choice(ADDITIONAL_LINKS).format(slug=_slug(other))]
        if rng.random() < 0.3:
            links.append(rng.choice(ADDITIONAL_LINKS).format(slug=_slug(rng.choice(TITLES))))
        additional_seed_url = " ; ".join(links) if rng.random() < 0.5 else ",".join(links)
    seed_license = _weighted(rng, LICENSES)
    script = rng.choice(SCRIPTS[exercise])

    # --- constraints (non-result part) -----------------------------------------------------
    extra: list[str] = []
    if rng.random() < 0.7:
        for key, values in OTHER_CONSTRAINTS:
            if rng.random() < 0.5:
                extra.append(f"{key}:{rng.choice(values)}")

    # --- query + answer head -------------------------------------------------------------
    answer_head = ""
    result = None
    code_bias = 0.0
    if exercise == "mcq":
        opts = rng.sample(MCQ_OPTIONS, 4)
        opts = [_fill(rng, o, slots) for o in opts]
        correct = rng.randrange(4)
        letters = "ABCD"
        stem = bank["mcq_stem"].format(title=title)
        query = stem + "\n" + "\n".join(f"{letters[i]}) {o}" for i, o in enumerate(opts))
        letter = letters[correct]
        style = rng.random()
        if style < 0.45:
            answer_head = letter
        elif style < 0.8:
            answer_head = f"{letter.lower()}) {opts[correct]}"
        else:
            answer_head = f"{letter}) {opts[correct]}"
        result = letter.lower() if rng.random() < 0.5 else letter
        if rng.random() < P_INCONSISTENT:
            wrong = rng.choice([c for c in letters if c != letter])
            result = wrong.lower() if rng.random() < 0.5 else wrong
    elif exercise == "arithmetic":
        code_bias = 0.25
        n = rng.randint(2, 12)
        if rng.random() < 0.6:
            a = rng.randint(50, 20000)
            b = rng.randint(5, 900)
            value = a + b * n
            query = bank["arith_int"].format(title=title, a=f"{a:,}" if rng.random() < 0.5 else a,
                                              b=b, n=n)
            answer_head = _fmt_int(value, commas=value >= 1000 and rng.random() < 0.6)
            result = _fmt_int(value, commas=rng.random() < 0.15)
            if rng.random() < P_INCONSISTENT:
                result = str(value + rng.choice((-1, 1)) * rng.randint(1, 50))
        else:
            tenths = rng.randint(11, 5000)
            if tenths % 10 == 0:
                tenths += rng.randint(1, 9)
            total = tenths * n
            query = bank["arith_dec"].format(title=title, total=_fmt_tenths(total), n=n)
            answer_head = _fmt_tenths(tenths)
            result = _fmt_tenths(tenths, trailing_zero=rng.random() < 0.2)
            if rng.random() < P_INCONSISTENT:
                result = _fmt_tenths(tenths + rng.randint(1, 30))
    else:
        if language == "en":
            query = rng.choice(en_bank["queries"][exercise]).format(**slots)
        else:
            query = rng.choice(bank["queries"]).format(**slots)
            if exercise in ("creative_writing", "constrained_writing", "editing") and \
                    rng.random() < 0.5:
                # instruction-style rows sometimes mix an English task with a local question
                query += " " + rng.choice(en_bank["queries"][exercise]).format(**slots)
    if rng.random() < 0.1:
        query = query.lower() if rng.random() < 0.5 else query + " " + query.split()[0]

    # --- reasoning / answer ----------------------------------------------------------------
    reasoning = _paragraphs(rng, bank["reasoning"], slots, rng.randint(*REASONING_WORDS[li]),
                            per_par=(2, 5))
    if exercise == "arithmetic":
        reasoning += (f"\n\nLet me compute step by step and verify: the result should be "
                      f"{answer_head}.")
    body = _markdown_answer(rng, bank, slots, rng.randint(*ANSWER_WORDS[li]), code_bias)
    answer = f"{answer_head}\n\n{body}" if answer_head else body

    # --- constraints -----------------------------------------------------------------------
    if rng.random() < P_FAILED:
        result = "FAILED"
    parts = list(extra)
    if result is not None:
        item = rng.choice(FAILED_RESULT) if result == "FAILED" else f"result:{result}"
        parts.insert(rng.randint(0, len(parts)), item)
    constraints = "; ".join(parts)

    # --- blanks ---------------------------------------------------------------------------
    r = rng.random()
    if r < P_EMPTY_REASONING:
        reasoning = ""
    elif r < P_EMPTY_REASONING + P_WS_REASONING:
        reasoning = rng.choice(WHITESPACE_ONLY)
    if rng.random() < P_EMPTY_ANSWER:
        answer = "" if rng.random() < 0.5 else rng.choice(WHITESPACE_ONLY)

    # --- special characters ---------------------------------------------------------------
    fields = {"query": query, "synthetic_reasoning": reasoning, "synthetic_answer": answer}
    nonblank = [k for k, v in fields.items() if v.strip()]
    if rng.random() < P_CJK:
        k = rng.choice(nonblank)
        fields[k] = _insert_at_word(rng, fields[k], rng.choice(CJK_SNIPPETS))
    if rng.random() < P_EMOJI:
        for _ in range(rng.randint(1, 3)):
            k = rng.choice(nonblank)
            fields[k] = _insert_at_word(rng, fields[k], rng.choice(EMOJI))
    if rng.random() < P_HARMONY:
        k = rng.choice(nonblank)
        fields[k] = _insert_at_word(rng, fields[k], rng.choice(HARMONY_SNIPPETS))
    if rng.random() < P_NUL:
        k = rng.choice([k for k in ("query", "synthetic_answer") if k in nonblank])
        text = fields[k]
        pos = rng.randint(0, len(text))
        fields[k] = text[:pos] + "\x00" + text[pos:]

    answer = fields["synthetic_answer"]
    return {
        "synth_id": f"synth_{index:07d}",
        "language": language,
        "exercise": exercise,
        "model": model,
        "query": fields["query"],
        "query_seed_url": query_seed_url,
        "query_seed_text": query_seed_text,
        "additional_seed_url": additional_seed_url,
        "seed_license": seed_license,
        "constraints": constraints,
        "script": script,
        "synthetic_reasoning": fields["synthetic_reasoning"],
        "synthetic_answer": answer,
        "words": len(answer.split()),
    }


def generate_rows(n_rows: int, seed: int, start_index: int = 0, long: bool = False) -> list[dict]:
    """Rows ``start_index`` .. ``start_index + n_rows - 1`` of the sample corpus for ``seed``.

    Each row depends only on (seed, global index, long), so any split into shards yields the
    same rows. Keys are exactly ``RAW_COLUMNS`` in order.
    """
    if n_rows < 0 or start_index < 0 or start_index + n_rows > (1 << 40):
        raise ValueError("row range out of bounds")
    return [_make_row(seed, start_index + i, long) for i in range(n_rows)]


def rows_to_table(rows: list[dict]) -> pa.Table:
    columns = {name: [row[name] for row in rows] for name in RAW_COLUMNS}
    return pa.Table.from_pydict(columns, schema=RAW_SCHEMA)


def write_shards(output_dir, shards: int, rows_per_shard: int, seed: int,
                 long: bool = False) -> list[Path]:
    """Write ``shards`` files ``synth_NN.parquet`` of ``rows_per_shard`` rows; returns paths."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for s in range(shards):
        rows = generate_rows(rows_per_shard, seed, start_index=s * rows_per_shard, long=long)
        table = rows_to_table(rows)
        path = out / shard_filename(s)
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(
            table,
            tmp,
            row_group_size=ROW_GROUP_SIZE,
            compression=COMPRESSION,
            compression_level=COMPRESSION_LEVEL,
            use_dictionary=True,
            write_statistics=True,
            data_page_version="1.0",
            version="2.6",
        )
        tmp.replace(path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    ap.add_argument("--shards", type=int, default=DEFAULT_SHARDS)
    ap.add_argument("--rows-per-shard", type=int, default=DEFAULT_ROWS_PER_SHARD)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--long", action="store_true",
                    help="longer seed text / reasoning / answer (~1.3k o200k tokens per row)")
    args = ap.parse_args(argv)
    if args.shards < 1 or args.rows_per_shard < 1 or args.seed < 0:
        ap.error("--shards and --rows-per-shard must be >= 1, --seed >= 0")
    paths = write_shards(args.output_dir, args.shards, args.rows_per_shard, args.seed,
                         long=args.long)
    for p in paths:
        print(f"{p}  {p.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
