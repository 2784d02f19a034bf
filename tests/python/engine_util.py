"""Helpers of the engine plug-in tests: importing SGLang and vLLM (or skipping with the reason),
SGLang's own host KV pools on the CPU, restarting a kvpoold on its own socket."""
import os
import socket as socketlib
import subprocess
import time

import pytest

from conftest import KVPOOLD


ENGINE_VENV_HINT = ("scripts/pytest.sh runs it in the engine venv (KVP_ENGINE_VENV, default "
                   ".venv-engines: transformers 5 as the engines pin)")


def import_sglang():
    """Imports SGLang's storage interface and its real host KV pools or skips with the reason
    (SGLang's host pool modules import its model configs, which need transformers 5)."""
    try:
        from sglang.srt.mem_cache import hicache_storage
        from sglang.srt.mem_cache.storage import backend_factory
        from sglang.srt.mem_cache import utils
        from sglang.srt.mem_cache.pool_host import mha, mla  # noqa: F401
        from sglang.srt.mem_cache import device_pool_info  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure is the skip reason
        pytest.skip(f"sglang 0.5.23 with its host pools does not import here: "
                    f"{type(e).__name__}: {e}; {ENGINE_VENV_HINT}", allow_module_level=True)
    return hicache_storage, backend_factory, utils


def llama_dir(heads, dim):
    """A new folder holding a small Llama config.json (2 layers, heads KV heads of dim, no
    weights): what vLLM's ModelConfig needs to size a KV cache."""
    import json
    import tempfile
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": heads * 2 * dim, "intermediate_size": 128,
                   "num_attention_heads": 2 * heads, "num_key_value_heads": heads,
                   "head_dim": dim, "num_hidden_layers": 2, "vocab_size": 1000,
                   "max_position_embeddings": 4096, "torch_dtype": "float16"}, f)
    return d


def sglang_page_keys(tokens, page):
    """SGLang's own page hashes of a token sequence (get_hash_str, chained per page of page
    tokens; a last partial page has none)."""
    from sglang.srt.mem_cache.utils import get_hash_str
    keys, prior = [], None
    for i in range(0, len(tokens) - len(tokens) % page, page):
        prior = get_hash_str(tokens[i:i + page], prior)
        keys.append(prior)
    return keys


class HostPool:
    """SGLang's own host KV pool (MHATokenToKVPoolHost, or MLATokenToKVPoolHost with mla) on
    the CPU, built from CPU device buffers as SGLang's host assembly builds it; .real is the
    pool, page/fill go through its get_data_page / set_from_flat_data_page."""

    def __init__(self, layout, layers, heads, dim, page_size, pages, dtype, mla=False):
        import torch
        from sglang.srt.mem_cache import device_pool_info as dpi
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

        dev_tokens = 4 * page_size
        cpu = torch.device("cpu")

        def ptrs(ts):
            return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

        # the device buffers SGLang's device pools hand over (a padding page included)
        if mla:
            bufs = tuple(torch.zeros(dev_tokens + page_size, 1, dim, dtype=dtype)
                         for _ in range(layers))
            info = dpi.MLABufferInfo(
                buffers=bufs, data_ptrs=ptrs(bufs), layer_indices=tuple(range(layers)),
                device_layer_num=layers, page_size=page_size, kv_lora_rank=dim - dim // 8,
                qk_rope_head_dim=dim // 8, kv_cache_dim=dim, dtype=dtype, device=cpu)
            self.real = MLATokenToKVPoolHost(
                info, 2.0, 0, page_size, layout, pin_memory=False, device="cpu",
                device_capacity_tokens=dev_tokens, start_layer=0, end_layer=layers,
                target_layer_num=layers, host_token_capacity=pages * page_size)
        else:
            k = tuple(torch.zeros(dev_tokens + page_size, heads, dim, dtype=dtype)
                      for _ in range(layers))
            v = tuple(torch.zeros_like(t) for t in k)
            info = dpi.MHABufferInfo(
                buffers=dpi.KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                                      layout=dpi.KVBufferLayout.NHD),
                page_size=page_size, head_num=heads, head_dim=dim, v_head_dim=dim,
                dtype=dtype, device=cpu)
            self.real = MHATokenToKVPoolHost(
                info, 2.0, 0, page_size, layout, pin_memory=False, device="cpu",
                device_capacity_tokens=dev_tokens, start_layer=0, end_layer=layers,
                host_token_capacity=pages * page_size)
        self.page_size, self.dtype = page_size, dtype

    def page(self, p):
        """Page p as SGLang's flat data page (a copy)."""
        return self.real.get_data_page(p * self.page_size, flat=True).clone()

    def fill(self, p, seed):
        """Random bytes into page p (through set_from_flat_data_page); returns them, flat."""
        import torch

        g = torch.Generator().manual_seed(seed)
        x = torch.randn(self.real.get_dummy_flat_data_page().shape, generator=g).to(self.dtype)
        self.real.set_from_flat_data_page(p * self.page_size, x)
        return x

    def indices(self, pages):
        """SGLang's host_indices of whole pages: every token slot of each page."""
        import torch

        p = torch.as_tensor(pages, dtype=torch.int64)
        return (p[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)


def restart(d):
    """Starts a kvpoold again on daemon d's socket and config (after d.proc was killed)."""
    d.proc.wait()
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS")}
    if os.path.exists(d.sock):
        os.unlink(d.sock)
    d.proc = subprocess.Popen(
        [KVPOOLD, "--socket", d.sock, "--config", d.conf, "--log-level", "info"],
        stdout=d.log, stderr=d.log, env=env)
    # up once a connect succeeds: the socket file exists from bind(), before listen()
    end = time.monotonic() + 10
    while True:
        if d.proc.poll() is not None:
            raise RuntimeError(f"kvpoold exited with {d.proc.returncode} on restart")
        s = socketlib.socket(socketlib.AF_UNIX)
        try:
            s.connect(d.sock)
            return
        except OSError:
            if time.monotonic() > end:
                raise RuntimeError("kvpoold did not come up again in 10 s") from None
            time.sleep(0.01)
        finally:
            s.close()
