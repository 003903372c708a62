"""Upstream llama-server (xllamacpp's build of it) over HTTP, as a process of its own.

    python tests/llama_server.py MODEL.gguf --port PORT [--n-ctx N] [--n-parallel N] [--alias A]
                                 [--threads N] [--slot-save-path DIR] [--kv-unified]

Serves ``/health``, ``/v1/models``, ``/v1/chat/completions`` (``usage`` and ``timings`` in the
last streamed chunk), ``/props``, ``/slots`` and ``/metrics`` on 127.0.0.1:PORT until SIGTERM,
or until the process that started it is gone (a test run killed with SIGKILL cannot stop it).
A process of its own so that tests can kill it mid-reply, as a crash would.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import xllamacpp


def main() -> None:
    parent = os.getppid()
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--n-ctx", type=int, default=8192, help="context of each slot")
    ap.add_argument("--n-parallel", type=int, default=1)
    ap.add_argument("--alias", default="smollm2")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: llama.cpp's choice)")
    ap.add_argument("--slot-save-path", default="", help="/slots save and restore (into DIR)")
    ap.add_argument(
        "--kv-unified", action="store_true", help="one KV buffer for all slots (as -np auto)"
    )
    args = ap.parse_args()
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.port = args.port
    params.n_parallel = args.n_parallel
    params.n_ctx = args.n_ctx * args.n_parallel  # llama.cpp divides it among the slots
    params.endpoint_metrics = True
    if args.slot_save_path:  # the server writes there, under the names a request gives
        os.makedirs(args.slot_save_path, exist_ok=True)
        params.slot_save_path = os.path.join(args.slot_save_path, "")
    if args.kv_unified:  # what llama-server does when -np is left to it, idle slots cached
        params.kv_unified = True  # in host memory (--cache-idle-slots) at each new request
    if args.threads:  # two servers on one small machine: each its share of the cores
        params.cpuparams.n_threads = args.threads
        params.cpuparams_batch.n_threads = args.threads
    server = xllamacpp.Server(params)  # listening once this returns
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"listening on {server.listening_address}", flush=True)
    while os.getppid() == parent:  # no event says the parent is gone (re-parented): poll
        time.sleep(0.5)


if __name__ == "__main__":
    main()
