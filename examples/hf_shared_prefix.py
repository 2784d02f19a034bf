#!/usr/bin/env python3
"""hf_shared_prefix.py - several engine processes share a system prompt's KV through kvpool.

Each process loads the same small random-weight Llama (built from a config with a fixed seed:
nothing is downloaded) and serves prompts that all start with one system prompt. The first
process to get there computes the system prompt and publishes its pages; every other prompt,
in that process or another, reuses them and computes only its own turn. Each process prints,
per prompt, the tokens reused vs computed and the prefill time with kvpool against a full
prefill without it.

    python examples/hf_shared_prefix.py --kvpoold build/daemon/kvpoold     # starts its own
    python examples/hf_shared_prefix.py --socket /run/kvpool/kvpoold.sock  # pool hf-example

Needs torch, transformers and an installed kvpool package (pip install .). With --socket the
daemon must have the pool printed by --print-config.
"""
import argparse
import multiprocessing
import os
import queue
import shutil
import socket as socketlib
import subprocess
import sys
import tempfile
import time

POOL = "hf-example"
LAYERS, KV_HEADS, HEADS, HIDDEN, PAGE_TOKENS = 4, 2, 4, 256, 16


def pool_config(tokens):
    return (f"[pool.{POOL}]\nlayers = {LAYERS}\nkv_heads = {KV_HEADS}\n"
            f"head_dim = {HIDDEN // HEADS}\ndtype = fp32\npage_tokens = {PAGE_TOKENS}\n"
            f"device = sim\ndevice_capacity = {tokens}t\nhost_capacity = {tokens}t\n"
            "mlock = off\n")


def build_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=1024, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, max_position_embeddings=4096,
                      pad_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(1234)
    return LlamaForCausalLM(cfg).eval()


def tokens(n, seed):
    import torch

    return torch.randint(3, 1024, (1, n), generator=torch.Generator().manual_seed(seed))


def serve(rank, sock, system_tokens, user_tokens, prompts, out):
    import torch

    import kvpool
    from kvpool.transformers import KvpoolCache

    model = build_model()
    system = tokens(system_tokens, 7)
    lines = []
    with kvpool.connect(sock, name=f"hf-example-{rank}") as client, torch.no_grad():
        pool = client.attach(POOL)
        # a warm-up forward outside the timings: the first one pays the cold start (allocator,
        # kernels), which would otherwise count against the "without" of prompt 0
        model(torch.cat([system, tokens(user_tokens, 10**6 + rank)], dim=1))
        for i in range(prompts):
            ids = torch.cat([system, tokens(user_tokens, 1000 * rank + i)], dim=1)
            t0 = time.perf_counter()
            model(ids)
            t_full = time.perf_counter() - t0
            t0 = time.perf_counter()
            with KvpoolCache(pool, model.config) as cache:
                reused = cache.reuse(ids)
                model(ids[:, reused:], past_key_values=cache)
                cache.publish(ids)
            t_kvp = time.perf_counter() - t0
            lines.append(f"process {rank} prompt {i}: {reused} tokens reused, "
                         f"{ids.shape[1] - reused} computed; prefill {t_kvp * 1e3:.1f} ms "
                         f"with kvpool, {t_full * 1e3:.1f} ms without")
        pool.detach()
    out.put((rank, lines))


def start_daemon(kvpoold, tokens_cap):
    d = tempfile.mkdtemp(prefix="kvpool-example-")
    sock, conf = os.path.join(d, "kvpoold.sock"), os.path.join(d, "kvpoold.conf")
    with open(conf, "w") as f:
        f.write(pool_config(tokens_cap))
    log = open(os.path.join(d, "kvpoold.log"), "w")
    proc = subprocess.Popen([kvpoold, "--socket", sock, "--config", conf], stdout=log,
                            stderr=log)
    for _ in range(1000):
        s = socketlib.socket(socketlib.AF_UNIX)
        try:
            s.connect(sock)
            return proc, sock, d
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.01)
        finally:
            s.close()
    proc.kill()
    sys.exit(f"kvpoold did not start; see {log.name}")


def collect(out, procs, n, timeout):
    """n results from the engine processes; exits when one of them fails (a non-zero exit
    code, or an exit without a result) or when timeout seconds pass, rather than waiting
    forever for a result a dead process will never send."""
    results, deadline = [], time.monotonic() + timeout
    while len(results) < n:
        try:
            results.append(out.get(timeout=0.5))
            continue
        except queue.Empty:
            pass
        for p in procs:
            if p.exitcode:
                sys.exit(f"engine process {p.name} failed (exit code {p.exitcode})")
        if all(p.exitcode is not None for p in procs):
            # every one exited cleanly: what they sent is in the queue now, or never comes
            try:
                results.append(out.get(timeout=5))
                continue
            except queue.Empty:
                sys.exit("an engine process exited without a result")
        if time.monotonic() > deadline:
            sys.exit(f"the engine processes sent {len(results)} of {n} results in {timeout} s")
    return results


def join(procs):
    for p in procs:
        p.join(timeout=30)
        if p.exitcode is None:
            p.kill()
            sys.exit(f"engine process {p.name} did not exit")
        if p.exitcode:
            sys.exit(f"engine process {p.name} failed (exit code {p.exitcode})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", help="a running kvpoold's socket (with the pool hf-example)")
    ap.add_argument("--kvpoold", help="start this kvpoold binary on a temporary socket")
    ap.add_argument("--procs", type=int, default=3, help="engine processes (default 3)")
    ap.add_argument("--prompts", type=int, default=3, help="prompts per process (default 3)")
    ap.add_argument("--system-tokens", type=int, default=512)
    ap.add_argument("--user-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds to wait for the engine processes (default 600)")
    ap.add_argument("--print-config", action="store_true", help="the pool section, and exit")
    a = ap.parse_args()
    cap = 2 * a.procs * (a.system_tokens + a.user_tokens + PAGE_TOKENS)
    if a.print_config:
        print(pool_config(cap), end="")
        return
    proc = tmp = None
    sock = a.socket or os.environ.get("KVPOOL_SOCKET")
    if a.kvpoold:
        proc, sock, tmp = start_daemon(a.kvpoold, cap)
    if not sock:
        sys.exit("give --kvpoold PATH or --socket PATH")
    try:
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        # the first process publishes the system prompt; the others start once it has
        # daemonic: a process left hanging when this one gives up is killed at its exit
        first = ctx.Process(target=serve, args=(0, sock, a.system_tokens, a.user_tokens,
                                                a.prompts, out), daemon=True)
        first.start()
        results = collect(out, [first], 1, a.timeout)
        join([first])
        rest = [ctx.Process(target=serve, args=(r, sock, a.system_tokens, a.user_tokens,
                                                a.prompts, out), daemon=True)
                for r in range(1, a.procs)]
        for p in rest:
            p.start()
        results += collect(out, rest, len(rest), a.timeout)
        join(rest)
        for _, lines in sorted(results):
            print("\n".join(lines))
    finally:
        if proc:
            proc.terminate()
            proc.wait()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
