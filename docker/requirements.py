"""Write the requirement list of each image's extra, read from pyproject.toml.

``python docker/requirements.py --out docker/requirements`` writes ``reward.txt``, ``reward-slim.txt``,
``rollout.txt``, ``trainer.txt`` and the CUDA images' ``*-cuda.txt``: the base dependencies plus the
extra's own (self-references such as ``grpo-services[reward-slim]`` expanded). Images install these from
the wheelhouse first, in a layer that stays cached while only the project's code changes.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

IMAGES = {
    "reward": ["reward"],
    "reward-slim": ["reward-slim"],
    "rollout": ["rollout", "vllm"],
    "trainer": ["trainer"],
    "reward-cuda": ["reward"],
    "rollout-cuda": ["rollout", "vllm-cuda"],
    "trainer-cuda": ["trainer", "quantization"],
}
_SELF = re.compile(r"^grpo-services\[(?P<extras>[^\]]+)\]$")


def requirements(project: dict, extras: list[str]) -> list[str]:
    """Base dependencies plus those of ``extras``, with self-referencing extras expanded."""
    optional = project["optional-dependencies"]
    out: list[str] = list(project["dependencies"])
    pending = list(extras)
    seen: set[str] = set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in optional[extra]:
            match = _SELF.match(requirement)
            if match:
                pending.extend(e.strip() for e in match["extras"].split(","))
            else:
                out.append(requirement)
    return sorted(dict.fromkeys(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    parser.add_argument("--out", type=Path, default=Path("docker/requirements"))
    args = parser.parse_args()
    project = tomllib.loads(args.pyproject.read_text())["project"]
    args.out.mkdir(parents=True, exist_ok=True)
    for image, extras in IMAGES.items():
        (args.out / f"{image}.txt").write_text("\n".join(requirements(project, extras)) + "\n")


if __name__ == "__main__":
    main()
