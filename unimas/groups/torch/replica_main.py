"""The child side of a rollout replica (:mod:`unimas.groups.torch.rollout_replica`).

Started by the parent as ``python -m unimas.groups.torch.replica_main REQUEST_FD REPLY_FD PARENT_PID``.
The first request line is the group's spec; the child builds its own policy
from it (same sources, tokenizer and adapters) and an in-place sampler with
the group's sampling seed, points the policy's parameters at the shared
weight file, answers ``ready`` and then serves one request at a time until
its request pipe closes.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import traceback
from typing import Any, Callable

import torch

from unimas.config.schema import AlgorithmConfig, GenerationConfig, ModelGroupConfig
from unimas.groups.base import GroupSpec
from unimas.groups.hf import sampling
from unimas.groups.hf import source as source_of
from unimas.groups.torch.options import TorchOptions
from unimas.groups.torch.policy import TorchPolicy, device_for
from unimas.groups.torch.sampler import InPlaceSampler
from unimas.groups.torch.rollout_replica import (WeightLayout, decode_state, digests, encode_state, map_file, views,
                                                  watch_parent)


class RecordedStream:
    """Stands in for a streamed row's listener: keeps the ids the sampler hands it, for the parent to replay."""

    def __init__(self) -> None:
        self.ids: list[int] = []

    def start(self) -> None:
        self.ids.clear()

    def add(self, token: int) -> None:
        self.ids.append(token)


class Replica:
    """The sampling copy of one group's policy, its parameters read from the shared weight file."""

    def __init__(self, init: dict[str, Any]):
        options = TorchOptions.model_validate(init["options"])
        spec = GroupSpec(name=init["name"], config=ModelGroupConfig.model_validate(init["config"]), options=options,
                         adapters=list(init["adapters"]), seed=int(init["seed"]),
                         algorithm=AlgorithmConfig.model_validate(init["algorithm"]))
        model, tokenizer, _ = source_of.load_model(options, spec.name, spec.seed)  # weights come from the file
        self.policy = TorchPolicy(spec, model, tokenizer, device_for(spec))
        self.generator = torch.Generator(device=self.policy.device)
        self.generator.manual_seed(spec.seed)
        self.sampler = InPlaceSampler(spec, self.policy, self.generator, threading.RLock())
        layout = WeightLayout.from_json(init["layout"])
        problem = layout.mismatch(self.policy.model)
        if problem:
            raise RuntimeError(f"the replica's model does not match the trainer's: {problem}")
        self.mapping, data, self.version = map_file(init["weights"], layout.size)
        os.unlink(init["weights"])  # both sides have it mapped: nothing is left behind if either dies
        self.shared = views(data, layout)
        self.params = list(self.policy.model.parameters())
        self.loaded = -1
        if self.policy.device.type == "cpu":  # sample straight from the shared pages: no copy per update
            for param, view in zip(self.params, self.shared):
                param.data = view

    def current_version(self) -> int:
        """The version in the file; on a device, the file's weights are copied over when it changed."""
        version = int(self.version.item())
        if self.policy.device.type != "cpu" and version != self.loaded:
            with torch.no_grad():
                for param, view in zip(self.params, self.shared):
                    param.copy_(view)
            self.loaded = version
        return version

    def sample(self, request: dict[str, Any]) -> dict[str, Any]:
        gen = GenerationConfig.model_validate(request["generation"])
        version = self.current_version()
        stops = sampling.StopStrings(self.policy.tokenizer, request["stops"])
        streams = {int(row): RecordedStream() for row in request["streamed"]}
        rows = self.sampler.sample(request["prompts"], gen, bool(request["greedy"]), request["adapter"], stops,
                                   streams)
        return {"tokens": rows.tokens, "logprobs": rows.logprobs, "version": version,
                "streamed": {str(row): stream.ids for row, stream in streams.items()}}

    def digests(self, _: dict[str, Any]) -> dict[str, Any]:
        """The weights it would sample with now (on a device: after taking a newer version from the file)."""
        self.current_version()
        return {"digests": digests(self.policy.model)}

    def set_generator(self, request: dict[str, Any]) -> dict[str, Any]:
        self.generator.set_state(decode_state(request["state"]))
        return {}

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {
            "sample": self.sample,
            "digests": self.digests,
            "get_generator": lambda _: {"state": encode_state(self.generator.get_state())},
            "set_generator": self.set_generator,
        }


def serve(request_fd: int, reply_fd: int) -> None:
    requests, replies = os.fdopen(request_fd, "rb"), os.fdopen(reply_fd, "wb", buffering=0)

    def reply(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    line = requests.readline()
    if not line:
        return
    replica = Replica(json.loads(line))
    gc.collect()
    gc.freeze()  # the model and imported modules live as long as the replica: keep them out of full GC passes
    reply({"ready": True})
    handlers = replica.handlers()
    for line in requests:
        request = json.loads(line)
        try:
            reply(handlers[request["op"]](request))
        except Exception as exc:  # noqa: BLE001 - a request that fails is reported to the parent, which raises
            traceback.print_exc()
            reply({"error": f"{type(exc).__name__}: {exc}"})


def main(argv: list[str]) -> int:
    request_fd, reply_fd, parent = (int(a) for a in argv)
    watch_parent(parent)
    threads = int(os.environ.get("UNIMAS_TORCH_THREADS", "1"))
    torch.set_num_threads(threads)
    try:
        serve(request_fd, reply_fd)
    except BrokenPipeError:  # the parent went away while we answered
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
