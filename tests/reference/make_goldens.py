#!/usr/bin/env python3
"""Produces the HF-transformers golden files in tests/reference/goldens/.

Loads SmolLM2-135M-Instruct.Q4_1.gguf with transformers' GGUF loader (which
dequantizes every tensor to float32), runs it on the CPU in float32 and writes:

  goldens/model_goldens.json      per-prompt token ids, greedy continuation, top-5
  goldens/<name>.logits.f32       last-position logits, raw little-endian float32
  goldens/tokenizer_goldens.json  tokenizer-only cases

Run:  tests/reference/setup_venv.sh && \
      ${XDG_CACHE_HOME:-$HOME/.cache}/sluice/reference-venv/bin/python tests/reference/make_goldens.py
Env:  SLUICE_MODEL_DIR (default ~/.cache/sluice/models), where the .gguf lives.
"""

import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NEW_TOKENS = 32
LONG_PROMPT_RANGE = (950, 1050)

HERE = Path(__file__).resolve().parent
OUT = HERE / "goldens"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


# --------------------------------------------------------------------------- prompts


def long_prompt(tok):
    """Deterministic ~1000-token text: varied sentences from fixed word lists."""
    subjects = ["The old lighthouse keeper", "A young engineer", "The city council",
                "Every morning the baker", "The research team", "A quiet librarian",
                "The river pilot", "Our neighbour's cat", "The orchestra conductor",
                "A travelling merchant", "The night-shift nurse"]
    verbs = ["carefully examined", "quietly repaired", "proudly described",
             "patiently counted", "slowly rebuilt", "happily painted", "briefly visited"]
    objects = ["the broken clock tower", "a map of the northern coast",
               "seventeen wooden boxes", "the new railway bridge", "an ancient stone wall",
               "the garden behind the school", "a letter from 1894"]
    tails = ["before the storm arrived.", "while the town was still asleep.",
             "and nobody noticed for weeks.", "because the mayor had asked politely.",
             "although the weather was terrible.", "just after the market closed.",
             "with help from two apprentices."]
    text = ""
    i = 0
    while len(encode(tok, text)) < 1000:
        s = (f"{subjects[i % len(subjects)]} {verbs[(i * 3) % len(verbs)]} "
             f"{objects[(i * 5 + 1) % len(objects)]} {tails[(i * 2 + i // 7) % len(tails)]}")
        if i % 9 == 8:
            s += f" That was day {i + 1}, and the ledger showed {(i * 37) % 1000} entries."
        text += ("" if i == 0 else "\n\n" if i % 6 == 0 else " ") + s
        i += 1
    n = len(encode(tok, text))
    assert LONG_PROMPT_RANGE[0] <= n <= LONG_PROMPT_RANGE[1], n
    return text


def prompt_specs(tok):
    specs = [
        ("plain_english", "The quick brown fox jumps over the lazy dog. After that, the fox"),
        ("single_word", "Hello"),
        ("python_code",
         "def fibonacci(n):\n"
         "    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
         "    if n < 2:\n"
         "        return n\n"
         "    a, b = 0, 1\n"
         "    for _ in range(n - 1):\n"
         "        a, b = b, a + b\n"),
        ("french",
         "Le château de Versailles, situé près de Paris, était la résidence des rois de "
         "France. À l'époque, les élèves étudiaient"),
        ("japanese", "日本の首都は東京です。東京は世界で最も人口の多い都市の一つで、"),
        ("cyrillic_greek", "Москва — столица России. Η Αθήνα είναι η πρωτεύουσα της"),
        ("emoji",
         "I love pizza 🍕 and my family 👨\u200d👩\u200d👧\u200d👦 very much! "
         "Flags: 🇫🇷 🇯🇵, thumbs up 👍🏽. Next emoji:"),
        ("whitespace",
         "   leading spaces\tand\ttabs\n\n\nthree newlines above   \r\n"
         "windows line ending\r\n\tindented with a tab  then trailing   "),
        ("numbers", "Pi is about 3.14159 and 1234567 is larger; also 0.001, -42, 1e10, "
                    "2024-01-15 and 99.9%. The sum of 17 and 25 is"),
        ("mixed_punct",
         "«Bonjour», he said — “really?” 「はい」…(ok) ¿Qué? ¡Sí! [a]{b}<c> 100% #1 @home ~/x.y;"),
        ("counting", "1, 2, 3, 4, 5, 6, 7,"),
        ("long_1k", long_prompt(tok)),
    ]
    out = [{"name": n, "text": t} for n, t in specs]
    chats = [
        ("chat_capital", [{"role": "user", "content": "What is the capital of France?"}]),
        ("chat_system", [
            {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
            {"role": "user", "content": "Name the three primary colors."}]),
    ]
    for name, msgs in chats:
        rendered = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        out.append({"name": name, "text": rendered, "chat_messages": msgs})
    return out


# --------------------------------------------------------------------------- tokenizer cases

TOKENIZER_TEXTS = [
    # empty / single space
    "", " ",
    # ASCII words
    "Hello", "hello world", "Hello World", "HELLO WORLD", "a", "I",
    "The quick brown fox jumps over the lazy dog.",
    "antidisestablishmentarianism", "camelCaseIdentifier", "snake_case_identifier",
    "kebab-case-word", "https://example.com/path?q=1&r=2#frag", "user@example.com",
    # contractions
    "it's", "don't", "they're", "we've", "I'm", "you'll", "he'd",
    "IT'S", "DON'T", "THEY'RE", "WE'VE", "I'M", "YOU'LL", "HE'D",
    "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D", "rock 'n' roll", "the dogs' bones",
    "it’s curly ‘quoted’", "'''triple'''",
    # numbers
    "0", "7", "42", "123", "2024", " 2024", "1234567890", "12345678901234567890",
    "3.14159", "-273.15", "1,000,000", "1e-10", "0xDEADBEEF", "v1.2.3", "x1y22z333",
    "٣٤٥ ١٢", "²³¹ ½", "Ⅻ ①②",
    # punctuation runs
    "!!!", "?!?!", "...", "…", "---", "(((nested)))", "a,b;c:d", "<<>>", "{}[]()", "==>",
    "!=", "#!/bin/bash", "/* comment */", "C++", "$$$ %%% ^^^", "a.b.c.d", "!!!???...,,,",
    # spaces, tabs, newlines
    "  ", "   ", "a  b", "a   b    c", " leading", "trailing ", "  both  ", "\t", "\ttab",
    "a\tb\tc", "\n", "\n\n", "line1\nline2", "line1\n\nline2", "a\r\nb", " \n \n ",
    "\n\n\n\nfour", "    indented code", "if x:\n    return 1\n\telse\n",
    "x\u00a0y", "\u3000ideographic space", "word \n next",
    # unicode letters / marks
    "naïve café résumé", "Straße", "ÅÄÖ åäö", "e\u0301 versus \u00e9", "Ελληνικά",
    "Привет мир", "עברית", "العربية", "हिन्दी", "ไทย", "한국어", "Tiếng Việt",
    # CJK
    "中文", "你好，世界！", "日本語のテキスト", "ｆｕｌｌｗｉｄｔｈ", "東京タワー",
    # emoji
    "😀", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🇫🇷🇯🇵", "❤️", "🏳️\u200d🌈", "emoji😀in😀text",
    # odd but valid UTF-8
    "\ufffd", "\ufeffBOM", "zero\u200bwidth", "\u200d", "\ue000", "\U0010ffff", "\uffff",
    "\x00", "\x7f", "\x1b[31mred\x1b[0m", "\u0085", "\u2028\u2029", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\u0301",
    # special-token text inside raw text
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>\n",
    "text<|im_end|>more", " <|im_start|> ", "< |im_start| >", "<|im_start", "<|IM_START|>",
    "<repo_name>", "<s></s>",
    # longer mixed
    "int main() {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "Mixed: English, Français, 日本語, 123, 🎉 — done.",
]


def tokenizer_goldens(tok):
    special_ids = set(tok.all_special_ids) | set(tok.added_tokens_decoder.keys())
    cases = []
    for text in TOKENIZER_TEXTS:
        ids = encode(tok, text)
        cases.append({
            "text": text,
            "ids": ids,
            "decoded": tok.decode(ids),
            "contains_special_ids": any(i in special_ids for i in ids),
        })
    im = encode(tok, "<|im_start|>")
    parsed = im == [tok.convert_tokens_to_ids("<|im_start|>")]
    backend = json.loads(tok.backend_tokenizer.to_str())
    return {
        "model_file": MODEL_FILE,
        "model_sha256": MODEL_SHA256,
        "generated_by": versions(),
        "notes": (
            "ids = tokenizer(text, add_special_tokens=False).input_ids; "
            "decoded = tokenizer.decode(ids) (skip_special_tokens=False). "
            "special_token_text_parsed_as_special: whether HF maps the literal text "
            "'<|im_start|>' in raw input to the single special id."),
        "vocab_size": len(tok),
        "special_tokens": {
            "bos": tok.bos_token_id, "eos": tok.eos_token_id,
            "unk": tok.unk_token_id, "pad": tok.pad_token_id,
        },
        "added_tokens": {str(i): t.content for i, t in sorted(tok.added_tokens_decoder.items())},
        "special_token_text_parsed_as_special": parsed,
        "add_special_tokens_true_adds": [
            i for i in tok("x", add_special_tokens=True)["input_ids"]
            if i not in encode(tok, "x")],
        "clean_up_tokenization_spaces": bool(tok.clean_up_tokenization_spaces),
        "hf_pre_tokenizer": backend.get("pre_tokenizer"),
        "hf_normalizer": backend.get("normalizer"),
        "cases": cases,
    }


# --------------------------------------------------------------------------- model


def versions():
    import gguf  # noqa: F401
    from importlib.metadata import version
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gguf": version("gguf"),
        "tokenizers": version("tokenizers"),
        "accelerate": version("accelerate"),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


@torch.no_grad()
def run_prompt(model, tok, gen_args, p):
    ids = encode(tok, p["text"])
    assert ids, p["name"]
    x = torch.tensor([ids], dtype=torch.long)

    # 1) single forward over the whole prompt, last-position logits
    logits = model(input_ids=x).logits[0, -1].to(torch.float32).numpy()
    assert logits.shape == (model.config.vocab_size,), logits.shape
    logits.astype("<f4").tofile(OUT / f"{p['name']}.logits.f32")
    top = np.argsort(-logits, kind="stable")[:5]

    # 2) greedy continuation with the KV cache (generate)
    res = model.generate(input_ids=x, attention_mask=torch.ones_like(x),
                         return_dict_in_generate=True, output_logits=True, **gen_args)
    greedy = res.sequences[0, len(ids):].tolist()
    assert len(greedy) == NEW_TOKENS, (p["name"], len(greedy))
    step_logits = torch.stack(res.logits, 0)[:, 0].float()  # [32, vocab], raw (unprocessed)
    assert step_logits.argmax(-1).tolist() == greedy, p["name"]
    top2 = step_logits.topk(2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    if greedy[0] != int(top[0]):
        log(f"WARNING {p['name']}: generate's first token {greedy[0]} != argmax {int(top[0])}")

    # 3) cross-check: one uncached forward over prompt + greedy[:-1]
    full = torch.tensor([ids + greedy[:-1]], dtype=torch.long)
    am = model(input_ids=full).logits[0, len(ids) - 1:].argmax(-1).tolist()
    mism = [i for i, (a, b) in enumerate(zip(am, greedy)) if a != b]
    if mism:
        log(f"WARNING {p['name']}: uncached argmax differs from generate at steps {mism} "
            f"(margins {[round(margins[i], 4) for i in mism]})")

    entry = {
        "name": p["name"],
        "text": p["text"],
        "prompt_tokens": ids,
        "logits_file": f"{p['name']}.logits.f32",
        "logits_top5": [{"id": int(i), "logit": float(logits[i])} for i in top],
        "greedy_tokens": greedy,
        "greedy_text": tok.decode(greedy),
        "greedy_top2_margins": [round(m, 5) for m in margins],
        "greedy_uncached_mismatch_steps": mism,
    }
    if "chat_messages" in p:
        entry["chat_messages"] = p["chat_messages"]
    return entry


def main():
    model_dir = Path(os.environ.get("SLUICE_MODEL_DIR",
                                    Path.home() / ".cache" / "sluice" / "models"))
    path = model_dir / MODEL_FILE
    got = sha256_file(path)
    if got != MODEL_SHA256:
        sys.exit(f"{path}: sha256 {got} != expected {MODEL_SHA256}")
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.logits.f32"):
        old.unlink()
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=MODEL_FILE)
    # `dtype` is the transformers-5 name of `torch_dtype` (which still works but warns).
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=MODEL_FILE,
                                                 dtype=torch.float32)
    model.to("cpu").eval()
    log(f"loaded in {time.time() - t0:.1f}s")

    tgold = tokenizer_goldens(tok)
    with open(OUT / "tokenizer_goldens.json", "w", encoding="utf-8") as f:
        json.dump(tgold, f, ensure_ascii=False, indent=1)
        f.write("\n")
    log(f"tokenizer cases: {len(tgold['cases'])}")

    # Greedy: no sampling, no repetition penalty, and eos_token_id=None so generation
    # never stops early (EOS may appear and generation just continues); min_new_tokens is
    # NOT used because it would mask the EOS logit and change the argmax path.
    # The None has to be set on the model's own generation_config: generate() fills
    # unset (None) arguments from it, so passing eos_token_id=None alone is not enough.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = tok.pad_token_id
    gen_args = dict(do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS,
                    repetition_penalty=1.0, temperature=None, top_k=None, top_p=None)

    prompts = []
    for p in prompt_specs(tok):
        t = time.time()
        e = run_prompt(model, tok, gen_args, p)
        prompts.append(e)
        log(f"{e['name']:16s} {len(e['prompt_tokens']):5d} tok  {time.time() - t:5.1f}s  "
            f"{e['greedy_text']!r}")

    c = model.config
    doc = {
        "model_file": MODEL_FILE,
        "model_sha256": MODEL_SHA256,
        "generated_by": versions(),
        "method": {
            "loader": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=float32); "
                      "weights dequantized to float32 by gguf, CPU, eval, no_grad",
            "prompt_tokens": "tokenizer(text, add_special_tokens=False); no BOS is added",
            "logits": "raw little-endian float32, vocab_size values: next-token logits at "
                      "the last prompt position from one forward over the whole prompt",
            "greedy": f"generate(do_sample=False, max_new_tokens={NEW_TOKENS}, "
                      "eos_token_id=None, repetition_penalty=1.0): no early stop at EOS, "
                      "no logits processors",
            "greedy_top2_margins": "per step, top1 - top2 raw logit; small values mean "
                                   "a near-tie where another implementation may diverge",
        },
        "model_config": {
            "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_hidden_layers,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads,
            "head_dim": getattr(c, "head_dim", c.hidden_size // c.num_attention_heads),
            "rms_norm_eps": c.rms_norm_eps,
            "rope_parameters": getattr(c, "rope_parameters", None),
            "tie_word_embeddings": c.tie_word_embeddings,
            "max_position_embeddings": c.max_position_embeddings,
        },
        "prompts": prompts,
    }
    with open(OUT / "model_goldens.json", "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    log(f"wrote {len(prompts)} prompts, goldens/ = {total / 1e6:.2f} MB, "
        f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
