#!/usr/bin/env python3
"""Train and export tests/models/tiny_bert.onnx: a small BERT-style sentence encoder for CI.

Why it exists: the INT8/FP16 paths for encoders (dynamic quantization, int8 embedding tables,
SmoothQuant, masks) need a real encoder in the tests, and CI has no torch and cannot download one.

The model (fixed seeds, trained for a few seconds on CPU):
  - word embeddings (1024 x 64), learned position embeddings (64 x 64), embedding LayerNorm;
  - 3 pre-LN encoder layers: 4-head softmax attention with a BERT-style additive mask
    ((1 - mask) * float32 min, a -3.4e38 constant), exact GELU feed-forward (64 -> 256 -> 64);
  - final LayerNorm, masked mean pooling -> `embedding` [N, 64], and a linear head -> `logits`
    [N, 16].
Inputs `input_ids` and `attention_mask` (int64 [N, T], both dims dynamic), opset 17, TorchScript
exporter (dynamo=False) as scripts/make_models.py.

Task (synthetic "text"): 16 topics, each a distribution over the 1024-token vocabulary (a few topic
words plus shared function words); a sentence of 6-40 tokens is drawn from one topic with 30% of
its tokens from a second topic; the label is the main topic. Sentences are padded per batch of 8.

Outlier channels: real encoders (BERT, MiniLM) have a few hidden channels whose LayerNorm outputs
are 10-30x the median (measured on all-MiniLM-L6-v2: 28.5 against a median of 1.8). Brief training
does not grow them, so after training a function-preserving rescale puts them in: in each
pre-attention and pre-FFN LayerNorm, 3 channels get gamma and beta multiplied by 24 and the rows
of the MatMul weights reading them divided by 24. The FP32 function is unchanged (checked against
the unscaled model), per-tensor activation ranges are not, which is what SmoothQuant fixes.

Written: tests/models/tiny_bert.onnx, tests/models/tiny_bert_data/feed_<k>/{input_ids,attention_mask}.npy
(6 evaluation feeds of 8 sentences), tests/models/tiny_bert_calib/feed_<k>/... (4 calibration feeds
of 8 sentences, other sentences), tests/models/tiny_bert.json (training facts).

Usage: python scripts/make_tiny_bert.py [--out tests/models]    (needs torch, onnx, onnxruntime)
"""
import argparse
import json
import os
import shutil
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB, DIM, HEADS, LAYERS, FFN, MAXLEN, TOPICS = 1024, 64, 4, 3, 256, 64, 16
OUTLIER_CHANNELS, OUTLIER_SCALE = (5, 23, 47), 24.0


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, FFN)
        self.fc2 = nn.Linear(FFN, DIM)

    def forward(self, x, bias):
        n, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(DIM, dim=-1)
        shape = (n, t, HEADS, DIM // HEADS)
        q, k, v = (z.reshape(shape).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2) / (DIM // HEADS) ** 0.5 + bias
        a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, t, DIM)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyBert(nn.Module):
    def __init__(self):
        super().__init__()
        self.word = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(MAXLEN, DIM)
        self.ln_emb = nn.LayerNorm(DIM)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.ln_out = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, TOPICS)

    def forward(self, input_ids, attention_mask):
        t = input_ids.shape[1]
        pos = torch.arange(t, device=input_ids.device).unsqueeze(0)
        x = self.ln_emb(self.word(input_ids) + self.pos(pos))
        m = attention_mask.to(torch.float32)
        bias = (1.0 - m[:, None, None, :]) * torch.finfo(torch.float32).min
        for layer in self.layers:
            x = layer(x, bias)
        x = self.ln_out(x)
        w = m.unsqueeze(-1)
        emb = (x * w).sum(1) / w.sum(1).clamp(min=1.0)
        return emb, self.head(emb)


def make_topics(rng):
    """Token distribution of each topic: 40 topic words (heavy) + 200 shared function words."""
    probs = np.full((TOPICS, VOCAB), 1e-4)
    function_words = rng.choice(np.arange(4, VOCAB), 200, replace=False)
    probs[:, function_words] += 0.5 / 200
    for k in range(TOPICS):
        words = rng.choice(np.arange(4, VOCAB), 40, replace=False)
        probs[k, words] += rng.dirichlet(np.ones(40)) * 0.5
    return probs / probs.sum(1, keepdims=True)


def sentences(rng, probs, count):
    out, labels = [], []
    for _ in range(count):
        main, other = rng.choice(TOPICS, 2, replace=False)
        length = int(rng.integers(6, 41))
        pick = np.where(rng.random(length) < 0.3, other, main)
        out.append([int(rng.choice(VOCAB, p=probs[p])) for p in pick])
        labels.append(int(main))
    return out, np.array(labels)


def pad(batch):
    t = max(len(s) for s in batch)
    ids = np.zeros((len(batch), t), np.int64)
    mask = np.zeros((len(batch), t), np.int64)
    for i, s in enumerate(batch):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return ids, mask


def train(model, rng, probs, steps=600, batch=32):
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    for step in range(steps):
        sents, labels = sentences(rng, probs, batch)
        ids, mask = pad(sents)
        _, logits = model(torch.from_numpy(ids), torch.from_numpy(mask))
        loss = F.cross_entropy(logits, torch.from_numpy(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss)


def inject_outliers(model):
    """Function-preserving: LayerNorm channel c times s, rows c of the reading weights over s."""
    with torch.no_grad():
        for layer in model.layers:
            for ln, lin in ((layer.ln1, layer.qkv), (layer.ln2, layer.fc1)):
                for c in OUTLIER_CHANNELS:
                    ln.weight[c] *= OUTLIER_SCALE
                    ln.bias[c] *= OUTLIER_SCALE
                    lin.weight[:, c] /= OUTLIER_SCALE


def write_feeds(root, batches):
    if os.path.isdir(root):
        shutil.rmtree(root)
    for k, (ids, mask) in enumerate(batches):
        d = os.path.join(root, f"feed_{k}")
        os.makedirs(d)
        np.save(os.path.join(d, "input_ids.npy"), ids)
        np.save(os.path.join(d, "attention_mask.npy"), mask)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "models"))
    args = ap.parse_args()
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    rng = np.random.default_rng(1234)
    probs = make_topics(rng)
    model = TinyBert()
    final_loss = train(model, rng, probs)
    model.eval()

    eval_sents, eval_labels = sentences(np.random.default_rng(99), probs, 48)
    calib_sents, _ = sentences(np.random.default_rng(98), probs, 32)
    eval_batches = [pad(eval_sents[i:i + 8]) for i in range(0, 48, 8)]
    calib_batches = [pad(calib_sents[i:i + 8]) for i in range(0, 32, 8)]

    def run_torch(batches):
        with torch.no_grad():
            outs = [model(torch.from_numpy(i), torch.from_numpy(m)) for i, m in batches]
        return np.concatenate([o[0].numpy() for o in outs]), np.concatenate([o[1].numpy() for o in outs])

    emb_before, logits_before = run_torch(eval_batches)
    inject_outliers(model)
    emb_after, _ = run_torch(eval_batches)
    drift = float(np.abs(emb_after - emb_before).max())
    if drift > 1e-4:
        raise SystemExit(f"outlier injection changed the function: max |diff| {drift}")
    accuracy = float((logits_before.argmax(1) == eval_labels).mean())

    path = os.path.join(args.out, "tiny_bert.onnx")
    ids, mask = eval_batches[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (torch.from_numpy(ids), torch.from_numpy(mask)), path, dynamo=False, opset_version=17,
            input_names=["input_ids", "attention_mask"], output_names=["embedding", "logits"],
            dynamic_axes={"input_ids": {0: "N", 1: "T"}, "attention_mask": {0: "N", 1: "T"},
                          "embedding": {0: "N"}, "logits": {0: "N"}},
            do_constant_folding=True)
    onnx.checker.check_model(path, full_check=True)
    write_feeds(os.path.join(args.out, "tiny_bert_data"), eval_batches)
    write_feeds(os.path.join(args.out, "tiny_bert_calib"), calib_batches)

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    got = np.concatenate([sess.run(["embedding"], {"input_ids": i, "attention_mask": m})[0] for i, m in eval_batches])
    rel = float(np.linalg.norm(got - emb_after) / np.linalg.norm(emb_after))
    if rel > 1e-5:
        raise SystemExit(f"ORT vs PyTorch rel-L2 {rel}")

    lnout = [n for n in onnx.load(path).graph.node if n.op_type == "LayerNormalization"]
    facts = {
        "final_training_loss": round(final_loss, 4),
        "eval_accuracy": accuracy,
        "eval_sentences": 48,
        "calib_sentences": 32,
        "outlier_channels": list(OUTLIER_CHANNELS),
        "outlier_scale": OUTLIER_SCALE,
        "ort_vs_torch_rel_l2": rel,
        "layernorm_nodes": len(lnout),
        "bytes": os.path.getsize(path),
    }
    with open(os.path.join(args.out, "tiny_bert.json"), "w") as f:
        json.dump(facts, f, indent=2)
        f.write("\n")
    print(json.dumps(facts, indent=2))


if __name__ == "__main__":
    main()
