"""Golden ids for tessera's SentencePiece tokenizer (tests/data/test_sentencepiece_tokenizer.cpp).

Trains a small Llama-2-style SentencePiece model (BPE, byte fallback, identity
normalization, dummy prefix, split digits, vocab 1000) on the text files of Debian's
`fortunes` package, written to tests/data/fixtures/tokenizers/spm/tokenizer.model only
when it is missing or SPM_ORACLE_RETRAIN=1 (the committed fixture is what the goldens
describe), then encodes held-out texts with pip's `sentencepiece` (the same version as
Debian 12's libsentencepiece, 0.1.97) and writes the texts, ids and decoded texts.

Usage: sentencepiece_model.py OUT.json   (run through tests/oracles/run_oracle.sh)
"""
import io
import json
import os
import sys

import sentencepiece

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURE = os.path.join(ROOT, "tests", "data", "fixtures", "tokenizers", "spm", "tokenizer.model")
CORPUS = "/usr/share/games/fortunes"

# Held out from training: scripts and symbols fortunes lacks (so byte fallback fires),
# whitespace runs, tabs, newlines, digits (split one per piece), the empty string.
TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces   ",
    "tabs\there\tand\nnew\nlines\n\n",
    "multiple     spaces    between\t\t\twords",
    "Numbers: 3.14159, 2026, 1234567890 and -42.",
    "Grüße aus Köln — naïve café, Ærøskøbing.",
    "Здравствуй, мир! Ελληνικά κείμενα.",
    "日本語のテキストと中文文本。",
    "한국어 문장입니다.",
    "emoji: 🙂🚀🎉 and flags 🇩🇪",
    "mixed: abc日本😀123\u00a0nbsp\u200bzwsp",
    "עברית ועربية",
    "\u2581 the meta symbol itself, and <unk> <s> </s> as text",
    "A fortune: You will be successful in your work.\nQ: What is it? A: Nothing.\n",
    " \n \t ",
]


def corpus_files():
    files = []
    for name in sorted(os.listdir(CORPUS)):
        path = os.path.join(CORPUS, name)
        if name.endswith(".dat") or os.path.islink(path) or not os.path.isfile(path):
            continue  # *.dat are binary indexes; *.u8 are symlinks to the text files
        files.append(path)
    if not files:
        sys.exit(f"no text files in {CORPUS} (install Debian's `fortunes`)")
    return files


def corpus_lines():
    # The trainer's sentences: the lines of every file, in order (no sampling).
    for path in corpus_files():
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        yield from (line for line in text.split("\n") if line)


def train(model_path):
    os.makedirs(os.path.dirname(model_path), exist_ok=True)
    # From an iterator into memory: no file names end up in the model's trainer_spec,
    # so retraining gives the same bytes.
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=corpus_lines(),
        model_writer=model,
        model_type="bpe",
        vocab_size=1000,
        byte_fallback=True,
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        character_coverage=0.99995,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        max_sentence_length=4192,
        minloglevel=2,
    )
    with open(model_path, "wb") as f:
        f.write(model.getvalue())


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if not os.path.exists(FIXTURE) or os.environ.get("SPM_ORACLE_RETRAIN") == "1":
        train(FIXTURE)
        print(f"[oracle] trained {FIXTURE} ({os.path.getsize(FIXTURE)} bytes)")
    sp = sentencepiece.SentencePieceProcessor(model_file=FIXTURE)
    cases = []
    for text in TEXTS:
        ids = sp.encode(text)  # no BOS/EOS: the processor's default
        cases.append({"text": text, "ids": ids, "decoded": sp.decode(ids), "pieces": sp.id_to_piece(ids)})
    golden = {
        "versions": {"sentencepiece": sentencepiece.__version__},
        "model": os.path.relpath(FIXTURE, ROOT),
        "vocab_size": sp.get_piece_size(),
        "eos_id": sp.eos_id(),
        "bos_id": sp.bos_id(),
        "unk_id": sp.unk_id(),
        "cases": cases,
    }
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
