#!/usr/bin/env python3
"""Writes tests/data/bpe/: a small byte-level BPE and reference ids for test_bpe.

Hugging Face's `tokenizers` library (pip install tokenizers) trains a
byte-level BPE the way GPT-2's is built: the ByteLevel pre-tokenizer
(GPT-2's regular expression, no prefix space), all 256 byte symbols in the
initial alphabet, MERGES merges learned from TRAINING_TEXT below, and
<|endoftext|> as a special token (the trainer gives it id 0). Then:

  tokenizer.json   the tokenizer as `tokenizers` saves it (merges in the
                   pair form [["a","b"], ...]; test_bpe derives the older
                   string form "a b" from it)
  encoder.json     the same vocabulary in OpenAI's form: {token: id}
  vocab.bpe        the same merges in OpenAI's form: "#version: 0.2", then
                   one "a b" line per merge, by rank
  reference.json   [{"text": ..., "ids": [...]}, ...]: STRINGS encoded by
                   `tokenizers` (Tokenizer.encode(text).ids)

Nothing here runs at test time: the files are committed. Run from anywhere
after changing the strings or the training text:
    python3 tests/gen_bpe_reference.py
The output is deterministic for a given `tokenizers` version (0.23.3 made
the committed files).
"""
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "bpe")
MERGES = 400
EOT = "<|endoftext|>"

# Written for this fixture: English with contractions, digits and
# punctuation, some accented Latin, Greek, Russian, Chinese, Japanese and
# emoji, so that merges form inside multi-byte characters too.
TRAINING_TEXT = """\
The small tokenizer learns from this text. It doesn't know much, but it's
enough: we'll see which pairs of bytes it merges first, and they're mostly
the ones you'd guess. I'm sure the test will tell us if we've got it wrong.
Numbers such as 2024, 3.14159 and 1,000,000 appear here and there; so do
dates like 12/05/1999 and times like 10:45. The training text repeats some
words: the the the, token token, merge merge merge, byte byte byte byte.
\tIndented lines, trailing spaces,   runs of spaces, and blank lines:

Windows line ends\r\nshow up too.\r\n
Café, naïve, façade, déjà vu, jalapeño, Straße, smörgåsbord, crème brûlée.
Ελληνικά γράμματα και λέξεις. Русский текст тоже есть здесь.
中文的句子也在这里。我们学习字节对编码。日本語の文もあります。
Emoji: 🙂 🚀 👍🏽 ❤️ and a family 👨‍👩‍👧 in one cluster.
"Quotes", 'single quotes', (parentheses), [brackets], {braces}, <angles>.
email@example.org, path/to/file.txt, snake_case and camelCase names.
The end of a document is marked with a special token between documents.
"""

# Strings to encode: every class of the pre-tokenizer's expression, its
# lookahead, the special token inside text, and multi-byte text outside the
# training set (so the byte fallback of unseen characters is used).
STRINGS = [
    "",
    "Hello world",
    "Hello, world!",
    "The the THE tHe",
    "it's",
    "they're here",
    "we'll go",
    "I've seen it",
    "I'm done",
    "don't",
    "you'd say",
    "IT'S LOUD, WE'LL SEE",
    "'s's 're've'm'll'd't",
    "rock 'n' roll",
    "  leading spaces",
    "trailing spaces   ",
    "a  b   c    d",
    "\tTabs\tand\t\tmore tabs\t",
    " \t \t mixed",
    "line one\nline two\n",
    "windows\r\nline\r\nends\r\n",
    "blank\n\n\nlines",
    "\n",
    " ",
    "   ",
    "\n \n",
    "x\n  y",
    "\x0b\x0c vertical tab and form feed",
    "12345",
    "3.14159 and 2.71828",
    "1,000,000 ",
    "in 2024 we had 365 days",
    "abc123def456",
    "!!!???...",
    "(parentheses) [brackets] {braces} <angles>",
    "email@example.org",
    "snake_case and camelCase",
    "path/to/file.txt",
    "Café naïve façade",
    "crème brûlée",
    "Straße",
    "e\u0301 combining acute",
    "a\u0308\u0301 two marks",
    "\u0915\u094d\u0937 Devanagari conjunct",
    "\u0e01\u0e34\u0e19 Thai",
    "Ελληνικά γράμματα",
    "Русский текст",
    "中文的句子",
    "日本語の文もあります",
    "한국어 문장",
    "مرحبا بالعالم",
    "שלום עולם",
    "🙂",
    "🚀 launch",
    "👍🏽 thumbs",
    "👨\u200d👩\u200d👧 family",
    "❤️",
    "🇫🇷 flag",
    "superscript² and ½ and Ⅻ",
    "٣ Arabic-Indic digit",
    "non\u00a0breaking space",
    "ideographic\u3000space",
    "next\u0085line",
    "line\u2028separator",
    "zero\u200bwidth",
    "nul\x00byte",
    "\x1c\x1f control",
    "<|endoftext|>",
    "Hello<|endoftext|>world",
    "a <|endoftext|> b",
    "<|endoftext|><|endoftext|>",
    "end of doc.<|endoftext|>",
    "<|endoftext|>start",
    "<|endoftext|",
    "<|endoftext|>\n\n",
    "a" * 500,
    "ab" * 300,
    "token" * 100,
    " " * 200 + "x",
    "the " * 100,
    "\u00e9" * 100,
]


def train():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1 + 256 + MERGES,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAINING_TEXT], trainer)
    return tok


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = train()
    with open(os.path.join(OUT, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok.to_str())
    spec = json.loads(tok.to_str())
    merges = spec["model"]["merges"]
    vocab = tok.get_vocab(with_added_tokens=True)
    with open(os.path.join(OUT, "encoder.json"), "w", encoding="utf-8") as f:
        json.dump(dict(sorted(vocab.items(), key=lambda kv: kv[1])), f, ensure_ascii=False)
    with open(os.path.join(OUT, "vocab.bpe"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for m in merges:
            a, b = m if isinstance(m, list) else m.split(" ")
            f.write(f"{a} {b}\n")
    refs = []
    for s in STRINGS:
        ids = tok.encode(s).ids
        # decode(encode(x)) == x holds for the byte-level BPE: check it here too
        assert tok.decode(ids, skip_special_tokens=False) == s, s
        refs.append({"text": s, "ids": ids})
    with open(os.path.join(OUT, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(refs, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"{len(vocab)} tokens, {len(merges)} merges, {len(refs)} reference strings in {OUT}")


if __name__ == "__main__":
    main()
