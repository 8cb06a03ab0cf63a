"""What would help a job whose training steps wait for their input, from what the job declares."""

from __future__ import annotations

from typing import Tuple

from tpulaunch.job.schema import Job

IMAGE_ENCODINGS = ("png", "jpeg")


def input_help(job: Job, *, on_tpu: bool) -> Tuple[str, ...]:
    """Short suggestions, most effective first, for `tpulaunch train`'s input-bound line."""
    if job.data.input_fn:
        return (f"data.input_fn {job.data.input_fn}: read files with parallel interleave, map with "
                "num_parallel_calls=tf.data.AUTOTUNE, prefetch",
                "`tpulaunch data bench` times the pipeline alone")
    tips = []
    images = [f"data.{group}.{name}" for group in ("features", "labels")
              for name, spec in getattr(job.data, group).items() if spec.stored_as in IMAGE_ENCODINGS]
    if images:
        tips.append(f"store {', '.join(images)} raw instead of PNG/JPEG (encoding: raw; each image is decoded "
                    "on the host every time it is read)")
    if not job.data.cache:
        tips.append("data.cache: true if the decoded examples fit in host memory (read and decode once)")
    if job.data.skip_corrupt:
        tips.append("data.skip_corrupt: false once the data is clean (its count parses records in order)")
    tips.append("fewer, larger shards (100 MB or more), at least as many as reading threads")
    tips.append("a slice with more hosts: each host feeds only its own cores" if on_tpu
                else "more CPU cores for the input pipeline")
    return tuple(tips)
