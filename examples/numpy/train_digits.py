"""Data-parallel training of a small numpy MLP on scikit-learn's digits.

Each worker trains on its own shard of the training set; every step the
gradients are averaged over all workers with byteps push_pull, so all
workers keep identical weights. Run it with the launcher:

    bpslaunch --workers 2 --servers 1 -- python examples/numpy/train_digits.py

(the README's demo command does exactly this). Rank 0 prints the progress.
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import byteps.common as bps


def init_params(rng: np.random.Generator, sizes: list) -> dict:
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"w{i}"] = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        params[f"b{i}"] = np.zeros(fan_out, dtype=np.float32)
    return params


def forward_backward(params: dict, x: np.ndarray, y: np.ndarray) -> tuple:
    """Loss and gradients of a ReLU MLP with a softmax cross-entropy head."""
    hidden = np.maximum(x @ params["w0"] + params["b0"], 0.0)
    logits = hidden @ params["w1"] + params["b1"]
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    loss = -np.log(probs[np.arange(len(y)), y] + 1e-12).mean()
    dlogits = probs
    dlogits[np.arange(len(y)), y] -= 1.0
    dlogits /= len(y)
    grads = {"w1": hidden.T @ dlogits, "b1": dlogits.sum(axis=0)}
    dhidden = (dlogits @ params["w1"].T) * (hidden > 0)
    grads["w0"] = x.T @ dhidden
    grads["b0"] = dhidden.sum(axis=0)
    return float(loss), {k: v.astype(np.float32) for k, v in grads.items()}


def accuracy(params: dict, x: np.ndarray, y: np.ndarray) -> float:
    hidden = np.maximum(x @ params["w0"] + params["b0"], 0.0)
    return float(((hidden @ params["w1"] + params["b1"]).argmax(axis=1) == y).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    bps.init()
    rank, size = bps.rank(), bps.size()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=0)
    shard = slice(rank, None, size)  # this worker's share of the training set
    x_train, y_train = x_train[shard], y_train[shard]

    params = init_params(np.random.default_rng(0), [64, 64, 10])  # same seed: same start everywhere
    names = sorted(params)
    for name in names:
        bps.declare(name)
    steps = len(x_train) // args.batch_size
    rng = np.random.default_rng(rank)
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        losses = []
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            loss, grads = forward_backward(params, x_train[batch], y_train[batch])
            handles = {name: bps.push_pull_async(grads[name], name=name, average=True) for name in names}
            for name in names:
                params[name] -= args.lr * bps.synchronize(handles[name])
            losses.append(loss)
        if rank == 0 and (epoch % 5 == 4 or epoch == args.epochs - 1):
            print(f"epoch {epoch + 1:3d}  loss {np.mean(losses):.4f}  "
                  f"held-out accuracy {accuracy(params, x_test, y_test):.3f}  ({size} workers)", flush=True)
    final = accuracy(params, x_test, y_test)
    if rank == 0:
        print(f"done: held-out accuracy {final:.3f}", flush=True)
    bps.shutdown()
    if final < 0.9:
        raise SystemExit(f"accuracy {final:.3f} is below 0.9: training did not converge")


if __name__ == "__main__":
    main()
