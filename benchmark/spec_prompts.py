"""Prompt sets of the speculative-decoding benchmark (issue 44; bench_spec.py, bench_spec_side_by_side.sh).

REPETITIVE: 16 requests whose answer mostly repeats text given inside the prompt -- rewriting given code with one
small change, quoting a given passage, echoing a given JSON object with one field changed. The text to repeat is in
the prompt itself, so a proposer that copies from the prompt (NGRAM) has something to copy. Each prompt stays under
~300 tokens of the SmolLM2 tokenizer so prompt + 256 generated tokens fit a 1024-token llama.cpp slot.
CREATIVE: 16 open writing requests whose answer repeats nothing given (NGRAM's proposals are mostly rejected there).
Every server in one run gets the same prompts, in the same order, as chat messages.
"""

from __future__ import annotations

from typing import List

_CODE = [
    """def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    running = 0.0
    for i, v in enumerate(values):
        running += v
        if i >= window:
            running -= values[i - window]
        if i >= window - 1:
            result.append(running / window)
    return result""",
    """class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        have = self.items.get(name, 0)
        if count > have:
            raise KeyError(f"only {have} of {name} left")
        self.items[name] = have - count

    def total(self):
        return sum(self.items.values())""",
    """function parseQuery(query) {
  const params = {};
  for (const part of query.replace(/^\\?/, "").split("&")) {
    if (!part) continue;
    const [key, value] = part.split("=");
    params[decodeURIComponent(key)] = decodeURIComponent(value || "");
  }
  return params;
}""",
    """def read_config(path):
    settings = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings""",
    """int count_words(const char *text) {
    int count = 0;
    int in_word = 0;
    for (const char *p = text; *p; p++) {
        if (*p == ' ' || *p == '\\n' || *p == '\\t') {
            in_word = 0;
        } else if (!in_word) {
            in_word = 1;
            count++;
        }
    }
    return count;
}""",
    """def binary_search(items, target):
    low, high = 0, len(items) - 1
    while low <= high:
        mid = (low + high) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            low = mid + 1
        else:
            high = mid - 1
    return -1""",
]
_CODE_ASKS = [
    "Rewrite this Python function with the parameter `values` renamed to `samples`. Keep everything else identical "
    "and output only the code.",
    "Rewrite this Python class with a docstring added to the class. Keep every method identical and output only the "
    "code.",
    "Rewrite this JavaScript function using `let` instead of `const` for the variable `params`. Keep everything else "
    "identical and output only the code.",
    "Rewrite this Python function so that it also skips lines starting with `;`. Keep everything else identical and "
    "output only the code.",
    "Rewrite this C function with the variable `count` renamed to `words`. Keep everything else identical and output "
    "only the code.",
    "Rewrite this Python function with type hints added to its parameters. Keep everything else identical and output "
    "only the code.",
]

_PASSAGES = [
    "The lighthouse stood at the end of the rocky point, white paint peeling from its tower after forty winters of "
    "salt wind. Every evening at dusk the keeper climbed the one hundred and twelve steps, trimmed the wick, polished "
    "the great lens until it shone, and lit the lamp. Ships far out at sea saw the beam sweep across the water once "
    "every ten seconds, and they knew where the reef lay hidden beneath the waves.",
    "To make bread, mix five hundred grams of flour with ten grams of salt and seven grams of dried yeast. Add three "
    "hundred and fifty millilitres of warm water and stir until a rough dough forms. Knead the dough on a floured "
    "surface for ten minutes until it is smooth and elastic. Leave it in a covered bowl for one hour, shape it into a "
    "loaf, let it rise for another forty minutes, then bake it at two hundred and twenty degrees for thirty minutes.",
    "The committee met on Tuesday to review the budget for the coming year. After a long discussion, the members "
    "agreed to increase the funding for the public library by ten percent, to repair the roof of the community hall "
    "before the winter, and to postpone the new parking area until the next meeting. The chair thanked everyone for "
    "their patience and closed the meeting at half past nine in the evening.",
    "Water boils at one hundred degrees Celsius at sea level, but at higher altitudes the air pressure is lower, so "
    "water boils at a lower temperature. On a mountain three thousand metres high, water boils at about ninety "
    "degrees. This is why cooking pasta or boiling eggs takes longer in the mountains: the water is not as hot, even "
    "though it is bubbling just as strongly as it would at the coast.",
    "Please remember that the office will be closed on Friday for the annual maintenance of the heating system. All "
    "staff should save their work and shut down their computers before leaving on Thursday evening. The building "
    "will reopen on Monday at eight in the morning. If you need access to the building during the closure, contact "
    "the facilities team at least two days in advance so that they can arrange an escort.",
]
_PASSAGE_ASKS = [
    "Quote the following paragraph word for word, without any change or comment.",
    "Repeat the following recipe exactly as written.",
    "Copy the following meeting summary exactly, word for word.",
    "Quote this explanation exactly as it is written, word for word.",
    "Repeat this notice exactly, word for word, and add nothing.",
]

_JSONS = [
    '{"order_id": 10482, "status": "pending", "customer": {"name": "Maria Lopez", "email": "maria@example.com", '
    '"city": "Valencia"}, "items": [{"sku": "A-113", "name": "Desk lamp", "qty": 2, "price": 24.5}, {"sku": "B-207", '
    '"name": "Notebook", "qty": 5, "price": 3.2}], "shipping": "standard", "paid": false}',
    '{"station": "North Ridge", "date": "2026-03-14", "readings": [{"hour": 6, "temp_c": 2.1, "wind_kmh": 14}, '
    '{"hour": 9, "temp_c": 5.4, "wind_kmh": 18}, {"hour": 12, "temp_c": 9.8, "wind_kmh": 22}, {"hour": 15, '
    '"temp_c": 10.3, "wind_kmh": 19}, {"hour": 18, "temp_c": 6.7, "wind_kmh": 11}], "status": "raw"}',
    '{"user": "jchen", "role": "editor", "permissions": ["read", "write", "comment"], "teams": ["docs", "web"], '
    '"settings": {"theme": "dark", "language": "en", "notifications": {"email": true, "sms": false}}, '
    '"last_login": "2026-02-01T08:15:00Z", "status": "active"}',
    '{"book": {"title": "The Silent River", "author": "A. Novak", "year": 1998, "pages": 312, "genres": ["mystery", '
    '"drama"]}, "copies": [{"id": 1, "branch": "Central", "available": true}, {"id": 2, "branch": "East", '
    '"available": false}, {"id": 3, "branch": "West", "available": true}], "status": "listed"}',
    '{"service": "billing-api", "version": "2.4.1", "replicas": 3, "env": {"DB_HOST": "db.internal", "DB_PORT": '
    '5432, "CACHE_TTL_S": 300}, "ports": [8080, 9090], "healthcheck": {"path": "/health", "interval_s": 10, '
    '"timeout_s": 2}, "status": "staging"}',
]
_JSON_ASKS = [
    'Return this JSON object exactly, with "status" changed to "shipped". Output only the JSON.',
    'Return this JSON object exactly, with "status" changed to "checked". Output only the JSON.',
    'Return this JSON object exactly, with "role" changed to "admin". Output only the JSON.',
    'Return this JSON object exactly, with "status" changed to "archived". Output only the JSON.',
    'Return this JSON object exactly, with "replicas" changed to 5. Output only the JSON.',
]

REPETITIVE: List[str] = (
    [f"{ask}\n\n```\n{code}\n```" for ask, code in zip(_CODE_ASKS, _CODE)]
    + [f"{ask}\n\n{text}" for ask, text in zip(_PASSAGE_ASKS, _PASSAGES)]
    + [f"{ask}\n\n{obj}" for ask, obj in zip(_JSON_ASKS, _JSONS)]
)

CREATIVE: List[str] = [
    "Write a short story about a fox who learns to read the stars.",
    "Write a poem about the first snow of the year in a quiet village.",
    "Invent a new holiday and describe how people celebrate it.",
    "Write a letter from a sailor to his sister, describing a storm at sea.",
    "Describe a city on the moon two hundred years from now.",
    "Write a fairy tale about a clockmaker and a stolen hour.",
    "Tell the story of a dragon who is afraid of fire.",
    "Write a scene where two old friends meet again at a train station.",
    "Describe a market in a desert town at sunrise, with its sounds and smells.",
    "Write a short mystery story set in a museum at night.",
    "Write a speech given by a robot on its first day at school.",
    "Imagine a world where music is visible as colours, and describe one day there.",
    "Write a diary entry of an explorer who found a hidden valley.",
    "Write a story about a gardener whose plants whisper secrets.",
    "Describe the life of a lighthouse cat during one long winter.",
    "Write a myth explaining why the sea is salty.",
]

SETS = {"repetitive": REPETITIVE, "creative": CREATIVE}
assert len(REPETITIVE) == 16 and len(CREATIVE) == 16
