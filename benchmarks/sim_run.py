"""``LLMEngine.run`` against a hand loop of ``LLMEngine.step`` on the simulator, side by side: the
CPU seconds of the datacenter simulation of chapter 3 (its ``ci`` workload, widest cap).

    python benchmarks/sim_run.py [--pairs 3] [--requests 384] [--width 32]

``step()`` returns a ``RequestOutput`` per request that got a token, and each copies its request's
prompt; ``run`` returns the requests themselves and steps with ``step(outputs=False)``, which
builds outputs only for the step hooks. A simulated step costs microseconds, so that copy is a
share of a simulation's time. Each pair runs both ways on fresh engines, in an order that
alternates from pair to pair, and checks that both gave the same step history; prints each run's
CPU seconds (``time.process_time``) and the ratio (step loop / run) of each pair.
"""

from __future__ import annotations

import argparse
import time

from ai_evolution.fmt import es
from ai_evolution.hardware import get_device_spec
from ai_evolution.labs import get_spec
from ai_evolution.labs.continuous_batching import workload
from ai_evolution.model import get_preset
from ai_evolution.sim import RooflineCostModel, sim_engine


def main() -> None:
    ci = {n: p.default_for("ci") for n, p in get_spec("continuous_batching").params.items()}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=ci["dc_requests"])
    parser.add_argument("--width", type=int, default=ci["dc_max_num_seqs"])
    args = parser.parse_args()
    gpu, big = get_device_spec(ci["dc_device"]), get_preset(ci["dc_model"])
    cost = RooflineCostModel.from_device_spec(gpu, "bf16")
    cap = max(ci["dc_caps"])
    max_len = ci["dc_prompt_len"] + cap
    items = workload(args.requests, ci["dc_prompt_len"], ci["dc_mean_output"], cap,
                     big.vocab_size, 0)

    def once(way: str) -> tuple[float, list]:
        engine = sim_engine(big, cost, args.width, max_len, "continuous", dtype="bf16")
        start = time.process_time()
        if way == "run":
            engine.run(items)
        else:
            for item in items:
                engine.add_request(item.prompt_token_ids, item.params)
            while engine.has_unfinished_requests():
                engine.step()
        return time.process_time() - start, [(h.step, h.scheduled) for h in engine.history]

    print(f"{big.name} en {gpu.name}: {args.requests} peticiones, lote {args.width}, tope {cap}")
    for k in range(args.pairs):
        order = ("run", "step") if k % 2 == 0 else ("step", "run")
        got = {way: once(way) for way in order}
        assert got["run"][1] == got["step"][1], "run and step gave different step histories"
        print(f"par {k + 1}: run {es(got['run'][0], 2)} s de CPU, step {es(got['step'][0], 2)} s; "
              f"step / run = {es(got['step'][0] / got['run'][0], 2)} "
              f"({len(got['run'][1])} pasos)")


if __name__ == "__main__":
    main()
