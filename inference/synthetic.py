"""Realistic synthetic failure logs for every taxonomy category, and text augmentation.

The real corpus has a few logs per category, too few to learn from; the generator multiplies
them the way real logs vary: the framework's traceback frames, a launcher's rank prefixes and
interleaving, progress noise before the failure, the launcher's teardown after it, and every
path, host, size and rank drawn at random. :func:`augment` perturbs any log (real ones too):
numbers and paths substituted, benign lines dropped or reordered, noise injected, the start
truncated. Everything is deterministic given the seed.

A record's ``source`` names its message template (``synthetic/<category>/<index>``), so a
split by source holds out whole phrasings: a test of generalisation, not of memory.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from .api import is_error_start
from .corpus import Record
from .synthetic_context import (
    FRAMES,
    FRAMEWORKS,
    LAUNCHERS,
    noise_line,
    preamble,
    teardown,
    user_frame,
)
from .synthetic_messages import MESSAGES
from .taxonomy import CATEGORIES, label_of

__all__ = ["augment", "generate", "render_log"]

_WORDS = [
    "encoder",
    "decoder",
    "proj",
    "head",
    "backbone",
    "tokenizer",
    "dataset",
    "cfg",
    "batch",
    "logits",
    "hidden",
    "optimizer",
    "scheduler",
    "embed",
    "attn",
    "mlp",
    "vision_tower",
    "lm_head",
    "classifier",
    "pooler",
    "step_fn",
    "collate",
    "sampler",
]
_CLASSES = [
    "Trainer",
    "LlamaForCausalLM",
    "ResNet",
    "UNet2DConditionModel",
    "GPT2Model",
    "DataCollator",
    "ViTModel",
    "DistributedDataParallel",
    "LightningModule",
    "SFTTrainer",
    "DetectionModel",
    "BertForSequenceClassification",
    "Tensor",
]
_MODULES = [
    "flash_attn",
    "apex",
    "deepspeed",
    "transformers",
    "torchvision",
    "timm",
    "xformers",
    "bitsandbytes",
    "mmcv",
    "triton",
    "peft",
    "wandb",
    "tensorflow_addons",
    "jax.experimental",
    "horovod.torch",
    "sentencepiece",
    "einops",
    "nvidia.dali",
    "megatron.core",
]
_FILES = [
    "train.json",
    "model.safetensors",
    "checkpoint-500/optimizer.pt",
    "images/0001.jpg",
    "data.yaml",
    "config.json",
    "tokenizer.model",
    "shard-00017.tar",
    "labels.csv",
    "best.pt",
    "vocab.txt",
    "train.h5",
    "last.ckpt",
]
_HOSTS = [
    "gpu-node-{}",
    "node{}",
    "dgx-a100-{}",
    "ip-10-0-{}-17",
    "compute-0-{}",
    "worker-{}",
    "sh03-{}n07",
    "nid00{}",
    "hpc-gpu{}",
    "train-pod-{}-xk2p",
]
_DOMAINS = [
    "huggingface.co",
    "cdn-lfs.huggingface.co",
    "s3.amazonaws.com",
    "storage.googleapis.com",
    "api.wandb.ai",
    "github.com",
    "download.pytorch.org",
    "objects.githubusercontent.com",
]
_OPS = [
    "ALLREDUCE",
    "BROADCAST",
    "ALLGATHER",
    "_ALLGATHER_BASE",
    "REDUCE_SCATTER",
    "BARRIER",
    "_REDUCE_SCATTER_BASE",
    "COALESCED",
]
_SCRIPTS = [
    "train.py",
    "main.py",
    "finetune.py",
    "pretrain_gpt.py",
    "run_clm.py",
    "train_net.py",
    "tools/train.py",
    "sft.py",
    "trainer.py",
    "run_glue.py",
    "launch.py",
]
_PY_ROOTS = [
    "/usr/local/lib/python3.{v}/dist-packages",
    "/opt/conda/lib/python3.{v}/site-packages",
    "/home/{u}/miniconda3/envs/{env}/lib/python3.{v}/site-packages",
    "/home/{u}/.local/lib/python3.{v}/site-packages",
    "/scratch/{u}/venvs/{env}/lib/python3.{v}/site-packages",
    "C:\\Users\\{u}\\anaconda3\\envs\\{env}\\lib\\site-packages",
    "/usr/lib/python3/dist-packages",
    "/root/.venv/lib/python3.{v}/site-packages",
]
_USERS = ["user", "ubuntu", "root", "jdoe", "mlops", "researcher", "a100user", "svc-train"]
_ENVS = ["torch", "llm", "py310", "train", "ddp", "base", "vision", "rl"]


def _fill(rng: random.Random) -> dict[str, str]:
    """Random values for every ``{field}`` a template may use."""
    n = rng.randint(2, 9_999_999)
    dim = rng.choice([3, 16, 64, 128, 256, 512, 768, 1024, 2048, 4096, 5120])
    user, env = rng.choice(_USERS), rng.choice(_ENVS)
    path = rng.choice(
        [
            "/data/{u}/datasets/{w}",
            "/mnt/shared/{w}/checkpoints",
            "/home/{u}/{w}",
            "/scratch/{u}/runs/{w}",
            "./outputs/{w}",
            "/workspace/{w}/ckpt",
            "C:\\Users\\{u}\\{w}",
            "/gpfs/projects/{w}",
            "/lustre/{u}/{w}",
        ]
    )
    path = path.format(u=user, w=rng.choice(_WORDS))
    host = rng.choice(_HOSTS).format(rng.randint(1, 512))
    domain = rng.choice(_DOMAINS)
    return {
        "n": str(n),
        "n2": str(rng.randint(2, 9_999_999)),
        "small": str(rng.randint(1, 9)),
        "dim": str(dim),
        "dim2": str(rng.choice([3, 10, 32, 100, 256, 384, 1000, 3072, 4096])),
        "var": rng.choice(_WORDS),
        "var2": rng.choice(_WORDS),
        "cls": rng.choice(_CLASSES),
        "mod": rng.choice(_MODULES),
        "func": rng.choice(_WORDS),
        "file": rng.choice(_FILES),
        "path": path,
        "script": rng.choice(_SCRIPTS),
        "host": host,
        "domain": domain,
        "url": f"https://{domain}/{rng.choice(_WORDS)}/{rng.choice(_FILES)}",
        "ip": f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
        "port": str(rng.choice([29500, 29400, 12355, 8888, rng.randint(1024, 65000)])),
        "rank": str(rng.randint(0, 15)),
        "world": str(rng.choice([2, 4, 8, 16, 32, 64])),
        "pid": str(rng.randint(1000, 4_000_000)),
        "line": str(rng.randint(100, 2000)),
        "op": rng.choice(_OPS),
        "timeout": str(rng.choice([600000, 1800000, 60000, 300000])),
        "mmdd": f"{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}",
        "hms": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
        f".{rng.randint(0, 999_999_999):09d}",
        "iso": f"20{rng.randint(19, 26)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
        f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
        "mem": str(rng.choice([20, 64, 128, 256, 512, 1024, 2048])),
        "mem2": f"{rng.uniform(1, 900):.2f}",
        "gib": f"{rng.choice([11, 15, 23, 39, 79])}.{rng.randint(10, 99)}",
        "gib2": f"{rng.uniform(0.5, 78):.2f}",
        "pcibus": f"{rng.randint(16, 255):02x}",
        "hex": f"{rng.getrandbits(32):x}",
        "hexaddr": f"0x{rng.getrandbits(44):x}",
        "uuid": "-".join(f"{rng.getrandbits(b * 4):0{b}x}" for b in (8, 4, 4, 4, 12)),
        "run": f"{rng.choice(_WORDS)}-{rng.randint(1, 999)}",
        "pyroot": rng.choice(_PY_ROOTS).format(v=rng.choice([8, 9, 10, 11, 12]), u=user, env=env),
    }


def _traceback(rng: random.Random, framework: str, fill: dict[str, str]) -> list[str]:
    """A Python traceback through user code and then ``framework``'s library frames."""
    frames = [
        user_frame(rng, f"/home/{rng.choice(_USERS)}/{fill['script']}")
        for _ in range(rng.randint(1, 3))
    ]
    pool = FRAMES[framework] + (
        FRAMES["pytorch"] if framework in ("lightning", "deepspeed", "transformers") else []
    )
    frames += [
        (f"{fill['pyroot']}/{mod}", func, src)
        for mod, func, src in rng.sample(pool, k=rng.randint(0, min(6, len(pool))))
    ]
    style = rng.random()
    lines = []
    if style < 0.85:  # the interpreter's format
        lines.append("Traceback (most recent call last):")
        for path, func, src in frames:
            lines.append(f'  File "{path}", line {rng.randint(1, 3000)}, in {func}')
            lines.append(f"    {src}")
            if rng.random() < 0.15:
                lines.append("    " + "^" * rng.randint(4, 30))
    else:  # IPython / Jupyter format
        lines.append(f"{'-' * 75}\nTraceback (most recent call last)")
        for path, func, src in frames:
            num = rng.randint(1, 3000)
            lines += [
                f"File {path}:{num}, in {func}(self, *args, **kwargs)",
                f"--> {num} {src}",
                "",
            ]
    return "\n".join(lines).split("\n")


def _message(rng: random.Random, category: str, fill: dict[str, str]) -> tuple[int, str]:
    """(template index, filled message) for ``category``."""
    index = rng.randrange(len(MESSAGES[category]))
    return index, MESSAGES[category][index].format(**fill)


def _error_block(
    rng: random.Random, category: str, framework: str, fill: dict[str, str]
) -> tuple[int, list[str]]:
    index, text = _message(rng, category, fill)
    if text.startswith("!"):
        return index, text[1:].split("\n")
    block: list[str] = []
    if rng.random() < 0.2:  # a chained exception: a lower-level error of the same cause first
        _, first = _message(rng, category, fill)
        if not first.startswith("!"):
            block += _traceback(rng, framework, fill) + first.split("\n")
            block += [
                "",
                rng.choice(
                    [
                        "The above exception was the direct cause of the following exception:",
                        "During handling of the above exception, another exception occurred:",
                    ]
                ),
                "",
            ]
    if category == "syntax_error":
        block += ["Traceback (most recent call last):"] * (rng.random() < 0.3) + [
            f'  File "/home/{rng.choice(_USERS)}/{fill["script"]}", line {rng.randint(1, 900)}',
            "    " + rng.choice(["print x", "if x = 1:", "def f(a=1, b):", "x = (1, 2"]),
            "    " + " " * rng.randint(0, 12) + "^",
        ]
    elif rng.random() < 0.9:
        block += _traceback(rng, framework, fill)
    block += text.split("\n")
    return index, block


_PREFIXES = [
    "[rank{r}]: ",
    "[default{r}]:",
    "{r}: ",
    "[1,{r}]<stderr>:",
    "{host}: ",
    "stderr: ",
    "[{host}:{r}] ",
]


def _prefix_and_interleave(rng: random.Random, blocks: Sequence[list[str]], host: str) -> list[str]:
    """Each rank's lines prefixed its launcher's way, the ranks' outputs merged at random."""
    style = rng.choice(_PREFIXES)
    ranks = rng.sample(range(16), k=len(blocks))
    queues = [
        [style.format(r=r, host=host) + line for line in block]
        for r, block in zip(ranks, blocks, strict=True)
    ]
    out: list[str] = []
    while any(queues):
        q = rng.choice([q for q in queues if q])
        out.append(q.pop(0))
    return out


def render_log(rng: random.Random, category: str, framework: str, launcher: str) -> tuple[int, str]:
    """(message template index, the log text) of one failed job."""
    fill = _fill(rng)
    lines = preamble(rng, launcher, fill)
    index, block = _error_block(rng, category, framework, fill)
    if launcher != "none" and rng.random() < 0.4:
        copies = [block] + [
            _error_block(rng, category, framework, fill)[1] for _ in range(rng.randint(0, 2))
        ]
        block = _prefix_and_interleave(rng, copies, fill["host"])
    lines += block
    if label_of(category) == "deterministic" and launcher != "none" and rng.random() < 0.15:
        # Collateral damage on the other ranks: the first root cause still decides.
        lines.append(MESSAGES["collective_timeout"][0][1:].format(**_fill(rng)))
    if rng.random() < 0.2:
        lines += [noise_line(rng, fill) for _ in range(rng.randint(1, 3))]
    signal_death = category in ("node_failure_or_preemption", "gpu_hardware_error")
    lines += teardown(rng, launcher, fill, signal_death)
    return index, "\n".join(lines)


_DIGITS = re.compile(r"\d+")
_PY_ROOT = re.compile(r"(?:/[\w.-]+)+/(?:site|dist)-packages")


def augment(text: str, rng: random.Random) -> str:
    """A perturbed copy of a log with the same label (see module docstring)."""
    lines = text.split("\n")
    if rng.random() < 0.5:
        lines = [
            _DIGITS.sub(lambda m: str(rng.randint(0, 10 ** len(m.group()))), line) for line in lines
        ]
    if rng.random() < 0.4:
        root = rng.choice(_PY_ROOTS).format(
            v=rng.choice([8, 10, 11]), u=rng.choice(_USERS), env=rng.choice(_ENVS)
        )
        lines = [_PY_ROOT.sub(root.replace("\\", "/"), line) for line in lines]
    first_error = next((i for i, line in enumerate(lines) if is_error_start(line)), len(lines))
    fill = _fill(rng)
    if rng.random() < 0.5:  # drop or inject benign lines before the error
        head = [line for line in lines[:first_error] if rng.random() > 0.3]
        for _ in range(rng.randint(0, 6)):
            head.insert(rng.randint(0, len(head)), noise_line(rng, fill))
        lines = head + lines[first_error:]
    if rng.random() < 0.25 and len(lines) > 4:  # the excerpt starts mid-log
        lines = lines[rng.randint(1, max(1, min(first_error + 3, len(lines) - 3))) :]
    if rng.random() < 0.1:
        lines = [line.strip() for line in lines]
    if rng.random() < 0.1:
        lines = [line.replace('"', "\u201c", 1).replace('"', "\u201d", 1) for line in lines]
    if rng.random() < 0.05:
        lines = ["stderr: " + line for line in lines]
    return "\n".join(lines)


def generate(
    n: int,
    seed: int,
    categories: Sequence[str] = CATEGORIES,
    frameworks: Sequence[str] = FRAMEWORKS,
) -> list[Record]:
    """``n`` synthetic records, categories balanced, deterministic given ``seed``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        category = categories[i % len(categories)]
        framework = rng.choice(frameworks)
        launcher = rng.choice(LAUNCHERS)
        index, text = render_log(rng, category, framework, launcher)
        if rng.random() < 0.5:
            text = augment(text, rng)
        out.append(
            Record(
                id=f"syn-{seed}-{i}",
                source=f"synthetic/{category}/{index}",
                framework=framework,
                category=category,
                label=label_of(category),
                log=text,
            )
        )
    return out
