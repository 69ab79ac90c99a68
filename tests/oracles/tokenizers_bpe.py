#!/usr/bin/env python3
"""Hugging Face `tokenizers` and OpenAI `tiktoken` as the oracles for tessera's byte-level
BPE tokenizers (include/tessera/data/bpe_tokenizer.h).

Fixtures (tests/data/fixtures/tokenizers/, written only when missing or with
TOKENIZERS_ORACLE_RETRAIN=1, so the goldens always come from the committed files):
  gpt2_style/{vocab.json, merges.txt, tokenizer.json}   ByteLevel(use_regex=True) pre-tokenizer,
      <|endoftext|> special (id 0), trained with tokenizers' BpeTrainer on the fortunes corpus
  llama3_style/tokenizer.json   Split(Llama 3 regex, isolated) + ByteLevel(use_regex=False),
      ignore_merges=True, specials <|begin_of_text|>, <|end_of_text|>, reserved tokens after the vocab
The corpus: the text files of /usr/share/games/fortunes (Debian package `fortunes`), sorted.

Goldens (argv[1], committed as goldens/tokenizers_bpe.json):
  {"versions": {...}, "texts": [...],
   "tokenizers": [{"name": "gpt2_style", "ids": [[...] per text], "decoded_equal": [...]}, ...]}
Every text is encoded with `tokenizers` and with a tiktoken.Encoding built from the same vocab
(mergeable ranks = token ids, the same pattern, allowed_special="all"); the script asserts they
agree. "gpt2_style_prefix_space" is the gpt2_style tokenizer.json with the ByteLevel
pre-tokenizer's add_prefix_space=true (HF only: tiktoken has no such option).
encode() never applies the post_processor (no BOS), matching tessera.
"""
import json
import os
import random
import sys

import tiktoken
import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(ROOT, "tests", "data", "fixtures", "tokenizers")
CORPUS = "/usr/share/games/fortunes"
VOCAB_SIZE = 1500

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>"]

HELD_OUT = [
    "",
    " ",
    "Hello, world!",
    "Hello world",
    "  leading spaces and trailing spaces   ",
    "tabs\tand\t\tdouble tabs\t",
    "windows line\r\nendings\r\n\r\nand a blank line\r\n",
    "unix\n\n\nnewlines\n  indented\n\tand tabbed\n",
    "a\u000bvertical tab, a\u000cform feed, a NEL\u0085here, nbsp\u00a0here, ideographic\u3000space",
    "IT'S we'Ll they're I've I'm you'll he'd she's WE'RE THEY'VE I'M YOU'LL HE'D don't DON'T",
    "'s 't 're 've 'm 'll 'd ''s '\u017f \u2019s rock'n'roll",
    "numbers 1 12 123 1234 12345 1234567890123456789 3.14159 -42 1,000,000 0x1F",
    "digits everywhere: 00000000000000000000000000000000000000000000000000000000000000",
    "Unicode digits \u0661\u0662\u0663 \u0967\u0968 \u00b2\u00b3 \u2167 \u2460\u2461 \uff11\uff12\uff13",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe se\u00f1or \u0153uvre",
    "combining: e\u0301 a\u0308 n\u0303 o\u0302\u0323 Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0421\u044a\u0435\u0448\u044c \u0436\u0435 \u0435\u0449\u0451",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35 \u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0 \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5",
    "emoji \U0001f600\U0001f600\U0001f600 \U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 "
    "\U0001f3f3\ufe0f\u200d\U0001f308 \U0001f1ef\U0001f1f5 \u2764\ufe0f",
    "punctuation!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((())) [[[]]] {{{}}} <<<>>> ~~~ ``` ||| \\\\\\",
    "code: def f(x):\n    return x**2 + 1  # comment\n\nif __name__ == '__main__':\n\tf(3)\n",
    "mixed abc123def 123abc abc!def a1!b2?c3 x_y_z CamelCaseWord snake_case_word",
    "special <|endoftext|> inside<|endoftext|>text and <|end_of_text|><|begin_of_text|>too",
    "<|endoftext|>",
    "<|reserved_special_token_0|><|reserved_special_token_1|> <|endoftext|><|endoftext|>",
    "almost special <|endoftext| <|end_of_text <|reserved_special_token_2|>",
    "trailing newline and spaces  \n  ",
    "\n",
    "   \n   \n",
    "!\n\n!!\r\n\r\n? \n a",
    "long run                                                                            of spaces",
    "\U0001f600" * 40,
    "a" * 300 + " " + "ab" * 150,
]


def corpus_texts():
    """The fortunes text files, sorted by name (binary *.dat index files skipped)."""
    texts = []
    for name in sorted(os.listdir(CORPUS)):
        path = os.path.join(CORPUS, name)
        if name.endswith(".dat") or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            texts.append(f.read().decode("utf-8", errors="replace"))
    if not texts:
        sys.exit(f"no fortunes text files in {CORPUS} (install the Debian package `fortunes`)")
    return texts


def train(model, pre_tokenizer, special_tokens):
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_texts(), trainer=trainer)
    return tok


def write_fixtures():
    retrain = os.environ.get("TOKENIZERS_ORACLE_RETRAIN") == "1"
    gpt2_dir = os.path.join(FIXTURES, "gpt2_style")
    if retrain or not os.path.exists(os.path.join(gpt2_dir, "tokenizer.json")):
        os.makedirs(gpt2_dir, exist_ok=True)
        tok = train(models.BPE(), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                    ["<|endoftext|>"])
        tok.save(os.path.join(gpt2_dir, "tokenizer.json"))
        tok.model.save(gpt2_dir)  # vocab.json + merges.txt
    llama_dir = os.path.join(FIXTURES, "llama3_style")
    if retrain or not os.path.exists(os.path.join(llama_dir, "tokenizer.json")):
        os.makedirs(llama_dir, exist_ok=True)
        split = pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False)
        tok = train(models.BPE(ignore_merges=True),
                    pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                             use_regex=False)]), [])
        tok.add_special_tokens(LLAMA3_SPECIALS)  # ids after the vocabulary, as in Llama 3
        tok.save(os.path.join(llama_dir, "tokenizer.json"))


def fortune_lines():
    lines = [l for t in corpus_texts() for l in t.split("\n") if l.strip()]
    return random.Random(1234).sample(lines, 12)


def gpt2_byte_decoder():
    """GPT-2's bytes_to_unicode table, inverted (unicode char -> byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tiktoken_encoding(name, tok_json, pattern):
    """A tiktoken.Encoding with the vocab's ids as ranks (specials from added_tokens)."""
    decode_char = gpt2_byte_decoder()
    specials = {t["content"]: t["id"] for t in tok_json["added_tokens"]}
    ranks = {bytes(decode_char[c] for c in token): i for token, i in tok_json["model"]["vocab"].items()
             if token not in specials}
    return tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tokenizers_bpe.py OUT.json")
    write_fixtures()
    texts = HELD_OUT + fortune_lines()
    cases = []
    for name, path, pattern in [("gpt2_style", "gpt2_style/tokenizer.json", GPT2_PATTERN),
                                ("llama3_style", "llama3_style/tokenizer.json", LLAMA3_PATTERN)]:
        with open(os.path.join(FIXTURES, path), encoding="utf-8") as f:
            tok_json = json.load(f)
        hf = Tokenizer.from_str(json.dumps(tok_json))
        tk = tiktoken_encoding(name, tok_json, pattern)
        ids, decoded = [], []
        for text in texts:
            a = hf.encode(text, add_special_tokens=False).ids
            b = tk.encode(text, allowed_special="all")
            assert a == b, f"{name}: tokenizers and tiktoken disagree on {text!r}: {a} vs {b}"
            ids.append(a)
            decoded.append(hf.decode(a, skip_special_tokens=False) == text and tk.decode(b) == text)
        cases.append({"name": name, "ids": ids, "decoded_equal": decoded})
        print(f"{name}: {len(texts)} texts, {sum(map(len, ids))} tokens, tokenizers == tiktoken")
    # The gpt2_style tokenizer.json with add_prefix_space=true (tokenizers only).
    with open(os.path.join(FIXTURES, "gpt2_style/tokenizer.json"), encoding="utf-8") as f:
        tok_json = json.load(f)
    tok_json["pre_tokenizer"]["add_prefix_space"] = True
    hf = Tokenizer.from_str(json.dumps(tok_json))
    cases.append({"name": "gpt2_style_prefix_space",
                  "ids": [hf.encode(t, add_special_tokens=False).ids for t in texts]})
    golden = {"generator": "tests/oracles/tokenizers_bpe.py",
              "versions": {"tokenizers": tokenizers.__version__, "tiktoken": tiktoken.__version__ if hasattr(
                  tiktoken, "__version__") else "0.14.0"},
              "texts": texts, "tokenizers": cases}
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=True, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
