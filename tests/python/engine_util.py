"""Helpers of the engine plug-in tests: importing SGLang and vLLM as far as this venv allows,
host pools shaped like SGLang's, restarting a kvpoold on its own socket."""
import os
import socket as socketlib
import subprocess
import time

import pytest

from conftest import KVPOOLD


def import_sglang():
    """Imports SGLang's storage interface or skips with the reason.

    sglang 0.5.23 pins transformers 5.19 and patches PretrainedConfig.__class_validators__ at
    import; the venv holds transformers 4.57.1 (kvpool.transformers is tested with it), which
    has no such list: an empty one makes that patch a no-op. Nothing of SGLang is replaced."""
    try:
        import transformers
        if not hasattr(transformers.PretrainedConfig, "__class_validators__"):
            transformers.PretrainedConfig.__class_validators__ = []
    except ImportError:
        pass
    try:
        from sglang.srt.mem_cache import hicache_storage
        from sglang.srt.mem_cache.storage import backend_factory
        from sglang.srt.mem_cache import utils
    except Exception as e:  # noqa: BLE001 - any import failure is the skip reason
        pytest.skip(f"sglang 0.5.23 does not import here: {type(e).__name__}: {e}",
                    allow_module_level=True)
    return hicache_storage, backend_factory, utils


class HostPool:
    """CPU tensors laid out as SGLang's MHATokenToKVPoolHost lays its K/V (init_kv_buffer):
    layer_first [2, layers, tokens, heads, dim], page_first [2, tokens, layers, heads, dim],
    page_first_direct [2, pages, layers, page_tokens, heads, dim]. (The real class imports
    SGLang's model configs, which need transformers 5.)"""

    def __init__(self, layout, layers, heads, dim, page_size, pages, dtype):
        import torch

        self.layout, self.layer_num, self.head_num = layout, layers, heads
        self.head_dim = self.v_head_dim = dim
        self.page_size, self.page_num, self.size = page_size, pages, pages * page_size
        self.dtype = dtype
        if layout == "layer_first":
            dims = (2, layers, self.size, heads, dim)
        elif layout == "page_first":
            dims = (2, self.size, layers, heads, dim)
        else:
            dims = (2, pages, layers, page_size, heads, dim)
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    @property
    def k_buffer(self):
        return self.kv_buffer[0]

    @property
    def v_buffer(self):
        return self.kv_buffer[1]

    def page(self, p):
        """Page p's K and V as [2, layers, page_size, heads, dim] (a copy)."""
        T = self.page_size
        if self.layout == "layer_first":
            return self.kv_buffer[:, :, p * T:(p + 1) * T].clone()
        if self.layout == "page_first":
            return self.kv_buffer[:, p * T:(p + 1) * T].transpose(1, 2).clone()
        return self.kv_buffer[:, p].clone()

    def fill(self, p, seed):
        import torch

        g = torch.Generator().manual_seed(seed)
        T = self.page_size
        x = torch.randn((2, self.layer_num, T, self.head_num, self.head_dim), generator=g)
        x = x.to(self.dtype)
        if self.layout == "layer_first":
            self.kv_buffer[:, :, p * T:(p + 1) * T] = x
        elif self.layout == "page_first":
            self.kv_buffer[:, p * T:(p + 1) * T] = x.transpose(1, 2)
        else:
            self.kv_buffer[:, p] = x
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
