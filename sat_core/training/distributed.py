"""Training over several processes (``torchrun --nproc_per_node N -m sat_core.train``) as one process would.

``--batch-size`` is the global batch: the captions of one optimizer step over all processes. Every process
draws the same global batches (the one-process order of the same seed) and takes its share of each, so the
steps, the learning rate and the warmup are those of one process with that batch; the loss is normalised by the
global batch's words (``scale_to_global``), so the averaged gradient is exactly the one-process gradient. A
global batch with fewer captions than processes (the tail of a length bucket) gives the processes left without
a caption one of its captions at weight 0 (a *filler*): every process runs every step, as DDP needs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from sat_core.data import karpathy
from sat_core.errors import SatError


def rank() -> int:
    return int(os.environ.get("RANK", 0))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def launch_command(module: str = "sat_core.train") -> str:
    """How this run was started, as the command that would start it again: ``torchrun …`` under torchrun."""
    world = world_size()
    if world == 1:
        return f"python -m {module}"
    if "TORCHELASTIC_RUN_ID" not in os.environ:  # another launcher (mpirun, a scheduler) set RANK/WORLD_SIZE
        return f"the launcher of this run ({world} processes) with -m {module}"
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = max(1, world // max(per_node, 1))
    return ("torchrun " + (f"--nnodes {nodes} " if nodes > 1 else "") +
            f"--nproc_per_node {per_node} -m {module}")


def resume_hint(run_dir: Path, module: str = "sat_core.train") -> str:
    return f"{launch_command(module)} --resume {run_dir}"


def per_rank_batch(batch_size: int, world: int) -> int:
    """Each process's share of the global batch; the global batch must split evenly."""
    if batch_size % world:
        lower, upper = batch_size - batch_size % world, batch_size + world - batch_size % world
        raise SatError(f"--batch-size {batch_size} is the global batch (captions per optimizer step over all {world} "
                       f"processes) and must split evenly between them: give {lower or upper} or {upper}.")
    return batch_size // world


def check_world(saved_world: int | None, run_dir: Path) -> None:
    """Refuse to resume a run with another number of processes than it was trained with."""
    world = world_size()
    if saved_world is None or saved_world == world:
        return
    if saved_world == 1:
        how = f"python -m sat_core.train --resume {run_dir}"
    else:
        how = f"torchrun --nproc_per_node {saved_world} -m sat_core.train --resume {run_dir} (over all nodes)"
    raise SatError(f"{run_dir} was trained by {_processes(saved_world)} and this is {_processes(world)}: each "
                   "process's random numbers (dropout, hard-attention samples) continue only where they were. "
                   f"Resume it as it was started: {how}; or start a new run with --out NEW_DIR.")


def _processes(n: int) -> str:
    return "one process" if n == 1 else f"{n} processes"


class GlobalBatches(Sampler[list[int]]):
    """This process's share of every global batch of ``inner`` (a one-process sampler of the global batch size):
    contiguous, near-equal slices, so an image's captions mostly stay together."""

    def __init__(self, inner: karpathy.BucketBatchSampler, rank: int, world: int) -> None:
        self.inner, self.rank, self.world = inner, rank, world

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.inner)

    def share(self, batch: Sequence[int]) -> tuple[list[int], bool]:
        """(this process's captions of ``batch``, whether they are a filler of weight 0)."""
        n = len(batch)
        start, end = n * self.rank // self.world, n * (self.rank + 1) // self.world
        return (list(batch[start:end]), False) if end > start else ([batch[0]], True)

    def fillers(self) -> set[int]:
        """Positions in this epoch's order where this process holds a filler."""
        return {i for i, batch in enumerate(self.inner.batches()) if self.share(batch)[1]}

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.inner.batches():
            yield self.share(batch)[0]


def make_loader(dataset: karpathy.CaptionDataset, batch_size: int, *, num_replicas: int = 1, rank: int = 0,
                **kwargs: Any) -> DataLoader:
    """``karpathy.make_loader`` with ``batch_size`` the global batch: over ``num_replicas`` processes each takes
    its share of every batch (``GlobalBatches``) instead of whole batches of its own."""
    if num_replicas == 1:
        return karpathy.make_loader(dataset, batch_size, **kwargs)
    per_rank_batch(batch_size, num_replicas)
    whole = karpathy.make_loader(dataset, batch_size, num_replicas=1, rank=0, **kwargs)
    return DataLoader(dataset, batch_sampler=GlobalBatches(whole.batch_sampler, rank, num_replicas),
                      collate_fn=whole.collate_fn, num_workers=whole.num_workers, pin_memory=whole.pin_memory)


def fillers(loader: DataLoader) -> set[int]:
    sampler = loader.batch_sampler
    return sampler.fillers() if isinstance(sampler, GlobalBatches) else set()


def all_sum(values: Sequence[float], device: torch.device) -> list[float]:
    """Each value summed over the processes (itself in one process)."""
    if world_size() == 1:
        return list(values)
    import torch.distributed as dist

    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def reduce_step(parts: dict[str, float], tokens: float, captions: int,
                device: torch.device) -> tuple[dict[str, float], float, int]:
    """The step's per-word terms as the global batch's means (weighted by each process's ``tokens``, 0 for a
    filler), and the global batch's words and captions."""
    if world_size() == 1:
        return parts, tokens, captions
    names = list(parts)
    sums = all_sum([tokens, captions, *(parts[k] * tokens for k in names)], device)
    means = {k: v / max(sums[0], 1e-12) for k, v in zip(names, sums[2:])}
    return means, sums[0], int(sums[1])


def any_process(flag: bool, device: torch.device) -> bool:
    """True on every process when ``flag`` is true on any (a signal may reach one process, or each at another
    step): they stop after the same step, or the others would wait for it in DDP forever."""
    return all_sum([float(flag)], device)[0] > 0 if world_size() > 1 else flag


def scale_to_global(loss: torch.Tensor, tokens: float, total_tokens: float) -> torch.Tensor:
    """A process's per-word loss rescaled so that DDP's mean over processes of its gradient is the gradient of the
    global batch's per-word loss: × (its words / all words) × processes."""
    world = world_size()
    if world == 1:
        return loss
    return loss * (tokens / max(total_tokens, 1e-12) * world)


def from_rank0(device: torch.device, value: float) -> float:
    """Rank 0's value on every process: a decision to stop must agree, or the others hang in DDP."""
    if world_size() == 1:
        return value
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(tensor, src=0)
    return float(tensor)


def barrier() -> None:
    if world_size() > 1:
        import torch.distributed as dist

        dist.barrier()


def finish() -> None:
    """Leave the process group (when there is one) so that the process exits without warnings."""
    if world_size() > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
