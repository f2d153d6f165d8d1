"""What surrounds an error in a real job log: tracebacks, progress noise, launcher banners.

The generator (:mod:`.synthetic`) puts a message from :mod:`.synthetic_messages` inside these, so
that the models learn to find the cause among the lines that every failed job prints whatever
its cause: tqdm bars, loss lines, warnings, NCCL INFO chatter, and the launcher's teardown
(which looks the same for a typo and for a dead node, so it must not decide the verdict).
"""

from __future__ import annotations

import random

__all__ = ["FRAMES", "FRAMEWORKS", "LAUNCHERS", "noise_line", "preamble", "teardown", "user_frame"]

FRAMEWORKS = ("pytorch", "tensorflow", "jax", "deepspeed", "horovod", "lightning", "transformers")
LAUNCHERS = ("none", "torchrun", "srun", "mpirun", "deepspeed", "accelerate")

# Library frames per framework: (module path under site-packages, function, source line).
FRAMES: dict[str, list[tuple[str, str, str]]] = {
    "pytorch": [
        ("torch/nn/modules/module.py", "_call_impl", "return forward_call(*args, **kwargs)"),
        (
            "torch/nn/modules/module.py",
            "_wrapped_call_impl",
            "return self._call_impl(*args, **kwargs)",
        ),
        ("torch/_tensor.py", "backward", "torch.autograd.backward("),
        ("torch/autograd/__init__.py", "backward", "_engine_run_backward("),
        ("torch/utils/data/dataloader.py", "__next__", "data = self._next_data()"),
        (
            "torch/utils/data/_utils/fetch.py",
            "fetch",
            "data = [self.dataset[idx] for idx in possibly_batched_index]",
        ),
        (
            "torch/distributed/distributed_c10d.py",
            "all_reduce",
            "work = group.allreduce([tensor], opts)",
        ),
        (
            "torch/distributed/distributed_c10d.py",
            "barrier",
            "work = default_pg.barrier(opts=opts)",
        ),
        (
            "torch/distributed/distributed_c10d.py",
            "init_process_group",
            "store, rank, world_size = next(rendezvous_iterator)",
        ),
        (
            "torch/nn/parallel/distributed.py",
            "forward",
            "inputs, kwargs = self._pre_forward(*inputs, **kwargs)",
        ),
        ("torch/serialization.py", "load", "with _open_file_like(f, 'rb') as opened_file:"),
        ("torch/optim/optimizer.py", "wrapper", "out = func(*args, **kwargs)"),
        ("torch/nn/functional.py", "linear", "return torch._C._nn.linear(input, weight, bias)"),
    ],
    "tensorflow": [
        (
            "keras/utils/traceback_utils.py",
            "error_handler",
            "raise e.with_traceback(filtered_tb) from None",
        ),
        ("keras/engine/training.py", "fit", "tmp_logs = self.train_function(iterator)"),
        (
            "tensorflow/python/eager/execute.py",
            "quick_execute",
            "tensors = pywrap_tfe.TFE_Py_Execute(ctx._handle, device_name, op_name,",
        ),
        (
            "tensorflow/python/util/traceback_utils.py",
            "error_handler",
            "raise e.with_traceback(filtered_tb) from None",
        ),
        (
            "tensorflow/python/eager/polymorphic_function/polymorphic_function.py",
            "__call__",
            "result = self._call(*args, **kwds)",
        ),
        ("tensorflow/python/data/ops/iterator_ops.py", "__next__", "return self._next_internal()"),
    ],
    "jax": [
        (
            "jax/_src/traceback_util.py",
            "reraise_with_filtered_traceback",
            "return fun(*args, **kwargs)",
        ),
        (
            "jax/_src/pjit.py",
            "cache_miss",
            "outs, out_flat, out_tree, args_flat, jaxpr = _python_pjit_helper(",
        ),
        (
            "jax/_src/interpreters/pxla.py",
            "__call__",
            "results = self.xla_executable.execute_sharded(input_bufs)",
        ),
        (
            "flax/training/train_state.py",
            "apply_gradients",
            "updates, new_opt_state = self.tx.update(",
        ),
        (
            "optax/_src/combine.py",
            "update_fn",
            "updates, new_s = fn(updates, s, params, **extra_args)",
        ),
    ],
    "deepspeed": [
        (
            "deepspeed/runtime/engine.py",
            "backward",
            "self.optimizer.backward(loss, retain_graph=retain_graph)",
        ),
        ("deepspeed/runtime/engine.py", "forward", "loss = self.module(*inputs, **kwargs)"),
        (
            "deepspeed/runtime/zero/stage_1_and_2.py",
            "backward",
            "self.loss_scaler.backward(loss.float(), retain_graph=retain_graph)",
        ),
        ("deepspeed/utils/nvtx.py", "wrapped_fn", "ret_val = func(*args, **kwargs)"),
        ("deepspeed/__init__.py", "initialize", "engine = DeepSpeedEngine(args=args,"),
        (
            "deepspeed/comm/comm.py",
            "all_reduce",
            "return cdb.all_reduce(tensor, op, group, async_op)",
        ),
    ],
    "horovod": [
        ("horovod/torch/mpi_ops.py", "synchronize", "mpi_lib.horovod_torch_wait_and_clear(handle)"),
        ("horovod/torch/optimizer.py", "step", "self.synchronize()"),
        ("horovod/torch/functions.py", "broadcast_parameters", "synchronize(handle)"),
        ("horovod/common/basics.py", "init", "result = self.MPI_LIB_CTYPES.horovod_init("),
    ],
    "lightning": [
        ("pytorch_lightning/trainer/trainer.py", "fit", "call._call_and_handle_interrupt("),
        (
            "pytorch_lightning/trainer/call.py",
            "_call_and_handle_interrupt",
            "return trainer_fn(*args, **kwargs)",
        ),
        ("pytorch_lightning/trainer/trainer.py", "_run", "results = self._run_stage()"),
        ("lightning/pytorch/loops/fit_loop.py", "run", "self.advance()"),
        (
            "lightning/pytorch/loops/training_epoch_loop.py",
            "advance",
            "batch_output = self.automatic_optimization.run(trainer.optimizers[0], batch_idx)",
        ),
        (
            "lightning/pytorch/strategies/strategy.py",
            "training_step",
            "return self.lightning_module.training_step(*args, **kwargs)",
        ),
        ("lightning/pytorch/core/module.py", "backward", "loss.backward(*args, **kwargs)"),
    ],
    "transformers": [
        ("transformers/trainer.py", "train", "return inner_training_loop("),
        (
            "transformers/trainer.py",
            "_inner_training_loop",
            "tr_loss_step = self.training_step(model, inputs)",
        ),
        ("transformers/trainer.py", "training_step", "self.accelerator.backward(loss, **kwargs)"),
        ("accelerate/accelerator.py", "backward", "loss.backward(**kwargs)"),
        (
            "transformers/modeling_utils.py",
            "from_pretrained",
            "resolved_archive_file = cached_file(",
        ),
        ("transformers/utils/hub.py", "cached_file", "resolved_file = hf_hub_download("),
        (
            "huggingface_hub/file_download.py",
            "hf_hub_download",
            "return _hf_hub_download_to_cache_dir(",
        ),
        ("datasets/load.py", "load_dataset", "builder_instance = load_dataset_builder("),
        ("datasets/builder.py", "download_and_prepare", "self._download_and_prepare("),
    ],
}

_USER_FUNCS = [
    "main",
    "train",
    "train_one_epoch",
    "run",
    "fit",
    "evaluate",
    "step",
    "forward",
    "build_model",
    "load_data",
    "__getitem__",
    "setup",
    "<module>",
]
_USER_LINES = [
    "loss = model(batch)",
    "trainer.fit(model, datamodule=dm)",
    "main(args)",
    "loss.backward()",
    "outputs = model(**inputs)",
    "train(cfg)",
    "trainer.train()",
    "optimizer.step()",
    "x = self.encoder(x)",
    "model = build_model(cfg)",
    "for batch in loader:",
    "state = train_step(state, batch)",
    "main()",
    "dataset = load_dataset(args.dataset)",
    "model.load_state_dict(ckpt['model'])",
]


def _progress(rng: random.Random) -> str:
    total = rng.choice([100, 500, 1000, 3125, 50000])
    done = rng.randint(0, total)
    pct = 100 * done // total
    bar = "\u2588" * (pct // 10) + " " * (10 - pct // 10)
    loss = rng.uniform(0.01, 9)
    styles = [
        f"Epoch {rng.randint(0, 99)}: {pct:3d}%|{bar}| {done}/{total} [{rng.randint(0, 59):02d}:"
        f"{rng.randint(0, 59):02d}<{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d},"
        f" {rng.uniform(0.5, 9):.2f}it/s, loss={loss:.3g}, v_num={rng.randint(0, 99)}]",
        f"{{'loss': {loss:.4f}, 'grad_norm': {rng.uniform(0, 9):.3f}, 'learning_rate':"
        f" {rng.uniform(1, 9):.1f}e-05, 'epoch': {rng.uniform(0, 5):.2f}}}",
        f"step {done} | loss {loss:.4f} | lr {rng.uniform(1, 9):.1f}e-04 | tok/s"
        f" {rng.randint(1000, 99999)}",
        f"{done}/{total} [{'=' * (pct // 5)}>{'.' * (20 - pct // 5)}] - ETA: {rng.randint(0, 59)}s"
        f" - loss: {loss:.4f} - accuracy: {rng.uniform(0, 1):.4f}",
        f"I{rng.randint(1, 12):02d}{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:"
        f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999999)}"
        f" {rng.randint(100, 99999)} train.py:{rng.randint(10, 900)}] step={done}"
        f" loss={loss:.3f}",
        f"[{rng.randint(2019, 2025)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"
        f" 1{rng.randint(0, 9)}:{rng.randint(10, 59)}:{rng.randint(10, 59)}"
        f",{rng.randint(100, 999)}]"
        f" [INFO] [logging.py:96:log_dist] [Rank 0] step={done}, skipped=0,"
        f" lr=[{rng.uniform(1, 9):.4f}e-05], mom=[(0.9, 0.999)]",
        f"     {rng.randint(0, 299)}/299     {rng.uniform(1, 40):.3g}G   {loss / 10:.5f}  "
        f" {loss / 30:.5f}   {loss / 50:.5f}       {rng.randint(10, 400)}       640: "
        f" {pct}%|{bar}| {done}/{total}",
        f"Epoch {rng.randint(1, 99)}/{rng.randint(100, 300)}",
        f"Train Epoch: {rng.randint(1, 99)} [{done}/{total} ({pct}%)]\tLoss: {loss:.6f}",
    ]
    return rng.choice(styles)


_WARNINGS = [
    "UserWarning: The given NumPy array is not writable, and PyTorch does not support"
    " non-writable tensors.",
    "warnings.warn(",
    "FutureWarning: `resume_download` is deprecated and will be removed in version 1.0.0.",
    "UserWarning: torch.utils.checkpoint: please pass in use_reentrant=True or"
    " use_reentrant=False explicitly.",
    "wandb: Tracking run with wandb version 0.16.3",
    "wandb: Syncing run {run}",
    "{host}:{pid}:{pid} [{rank}] NCCL INFO Bootstrap : Using eth0:{ip}<0>",
    "{host}:{pid}:{pid} [{rank}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:{ip}<0>",
    "{host}:{pid}:{pid} [{rank}] NCCL INFO comm 0x{hex} rank {rank} nranks 8 cudaDev {rank}"
    " busId 1{rank}000 - Init COMPLETE",
    "Some weights of the model checkpoint were not used when initializing the model.",
    "Loading checkpoint shards: 100%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588|"
    " {rank}/{rank} [00:0{rank}<00:00,  1.2{rank}s/it]",
    "GPU available: True (cuda), used: True",
    "LOCAL_RANK: {rank} - CUDA_VISIBLE_DEVICES: [0,1,2,3,4,5,6,7]",
    "Validation: 0it [00:00, ?it/s]",
    "Saving model checkpoint to /checkpoints/run-{pid}/checkpoint-{pid}",
    "2024-0{rank}-12 10:1{rank}:33.123456: I tensorflow/core/common_runtime/gpu/gpu_device.cc:1613]"
    " Created device /job:localhost/replica:0/task:0/device:GPU:0 with 78911 MB memory",
    "[W reducer.cpp:1300] Warning: find_unused_parameters=True was specified in DDP"
    " constructor, but did not find any unused parameters in the forward pass.",
    "huggingface/tokenizers: The current process just got forked, after parallelism has"
    " already been used. Disabling parallelism to avoid deadlocks...",
    "  | Name    | Type             | Params",
    "Setting ds_accelerator to cuda (auto detect)",
    "Using /root/.cache/torch_extensions/py310_cu121 as PyTorch extensions root...",
]


def noise_line(rng: random.Random, fill: dict[str, str]) -> str:
    """One benign line: progress, loss, warning or NCCL INFO chatter."""
    if rng.random() < 0.6:
        return _progress(rng)
    return rng.choice(_WARNINGS).format(**fill)


def preamble(rng: random.Random, launcher: str, fill: dict[str, str]) -> list[str]:
    """Lines printed before the failure: the launch banner, then training noise."""
    lines: list[str] = []
    if launcher == "torchrun" and rng.random() < 0.5:
        lines += [
            "WARNING:torch.distributed.run:",
            "*****************************************",
            "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default,"
            " to avoid your system being overloaded, please further tune the variable for"
            " optimal performance in your application as needed.",
            "*****************************************",
        ]
    elif launcher == "deepspeed" and rng.random() < 0.5:
        lines.append(
            f"[{fill['iso']}] [INFO] [runner.py:{fill['line']}:main] cmd ="
            f" /usr/bin/python -u -m deepspeed.launcher.launch --world_info=eyJsb2NhbGhv"
            f" --master_addr={fill['ip']} --master_port={fill['port']} {fill['script']}"
        )
    elif launcher == "srun" and rng.random() < 0.3:
        lines.append(f"srun: job {fill['n']} queued and waiting for resources")
    lines += [noise_line(rng, fill) for _ in range(rng.randint(0, 6))]
    return lines


def teardown(
    rng: random.Random, launcher: str, fill: dict[str, str], signal_death: bool
) -> list[str]:
    """What the launcher prints after a worker died: the same for every cause, by design.

    ``signal_death`` marks a worker killed from outside (exit code -9, signal 9) rather than
    one that raised; the launcher reports the two differently.
    """
    code = "-9" if signal_death else "1"
    if launcher == "torchrun":
        out = [
            f"WARNING:torch.distributed.elastic.multiprocessing.api:Sending process"
            f" {fill['pid']} closing signal SIGTERM"
        ] * rng.randint(0, 3)
        out.append(
            f"ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: {code})"
            f" local_rank: {fill['rank']} (pid: {fill['pid']}) of binary: /usr/bin/python3"
        )
        if rng.random() < 0.5:
            out += [
                "Traceback (most recent call last):",
                '  File "/usr/local/bin/torchrun", line 8, in <module>',
                "    sys.exit(main())",
                '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/launcher/'
                'api.py", line 263, in launch_agent',
                "    raise ChildFailedError(",
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                "============================================================",
                f"{fill['script']} FAILED",
                "------------------------------------------------------------",
                "Failures:",
                "  <NO_OTHER_FAILURES>",
                "------------------------------------------------------------",
                "Root Cause (first observed failure):",
                "[0]:",
                f"  time      : {fill['iso']}",
                f"  host      : {fill['host']}",
                f"  rank      : {fill['rank']} (local_rank: {fill['rank']})",
                f"  exitcode  : {code} (pid: {fill['pid']})",
                "  error_file: <N/A>",
                "  traceback : "
                + (
                    "Signal 9 (SIGKILL) received by PID " + fill["pid"]
                    if signal_death
                    else "To enable traceback see:"
                    " https://pytorch.org/docs/stable/elastic/errors.html"
                ),
                "============================================================",
            ]
        return out
    if launcher == "srun":
        what = "Killed" if signal_death else "Exited with exit code 1"
        return [
            f"srun: error: {fill['host']}: task {fill['rank']}: {what}",
            f"srun: launch/slurm: _step_signal: Terminating StepId={fill['n']}.0",
        ][: rng.randint(1, 2)]
    if launcher == "mpirun":
        return [
            "-------------------------------------------------------",
            "Primary job  terminated normally, but 1 process returned",
            "a non-zero exit code. Per user-direction, the job has been aborted.",
            "-------------------------------------------------------",
            "--------------------------------------------------------------------------",
            "mpirun detected that one or more processes exited with non-zero status, thus causing",
            "the job to be terminated. The first process to do so was:",
            "",
            f"  Process name: [[{fill['pid']},1],{fill['rank']}]",
            f"  Exit code:    {'137' if signal_death else '1'}",
            "--------------------------------------------------------------------------",
        ]
    if launcher == "deepspeed":
        return [
            f"[{fill['iso']}] [INFO] [launch.py:315:sigkill_handler] Killing subprocess"
            f" {fill['pid']}",
            f"[{fill['iso']}] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u',"
            f" '{fill['script']}', '--local_rank={fill['rank']}'] exits with return code ="
            f" {code}",
        ]
    if launcher == "accelerate":
        return [
            "Traceback (most recent call last):",
            '  File "/usr/local/bin/accelerate", line 8, in <module>',
            "    sys.exit(main())",
            '  File "/usr/local/lib/python3.10/site-packages/accelerate/commands/launch.py",'
            " line 1097, in launch_command",
            "    simple_launcher(args)",
            f"subprocess.CalledProcessError: Command '['/usr/bin/python', '{fill['script']}']'"
            f" returned non-zero exit status {'-9' if signal_death else '1'}.",
        ]
    return []


def user_frame(rng: random.Random, script_path: str) -> tuple[str, str, str]:
    """A frame in the user's own code."""
    return script_path, rng.choice(_USER_FUNCS), rng.choice(_USER_LINES)
