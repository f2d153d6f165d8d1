"""The error messages the generator draws from, per taxonomy category.

The deterministic categories are here, the nondeterministic ones in :mod:`.synthetic_transient`.

Each entry is a template: ``{name}`` fields are filled by :mod:`.synthetic` with varied values
(paths, hosts, sizes, ranks...). An entry that starts with ``!`` is printed as is (launcher and
driver lines, NCCL banners); any other entry is a Python exception, printed after a traceback.
Several phrasings per cause, from several frameworks and versions, because a model that has seen
one phrasing learns that phrasing, not the cause.
"""

from __future__ import annotations

from .synthetic_transient import TRANSIENT_MESSAGES

__all__ = ["MESSAGES"]

_DETERMINISTIC: dict[str, list[str]] = {
    "syntax_error": [
        "SyntaxError: invalid syntax",
        "SyntaxError: invalid syntax. Perhaps you forgot a comma?",
        "SyntaxError: unexpected EOF while parsing",
        "IndentationError: unexpected indent",
        "IndentationError: expected an indented block after 'if' statement on line {n}",
        "IndentationError: unindent does not match any outer indentation level",
        "TabError: inconsistent use of tabs and spaces in indentation",
        "SyntaxError: unterminated string literal (detected at line {n})",
        "SyntaxError: '(' was never closed",
        "SyntaxError: f-string: expecting '}}'",
        "SyntaxError: invalid decimal literal",
        "SyntaxError: positional argument follows keyword argument",
        "SyntaxError: Missing parentheses in call to 'print'. Did you mean print(...)?",
        "SyntaxError: invalid character '\u201c' (U+201C)",
        "SyntaxError: cannot assign to function call here. Maybe you meant '==' instead of '='?",
        "SyntaxError: non-default argument follows default argument",
    ],
    "python_runtime_error": [
        "!{path}/Loss.cu:{line}: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], thread:"
        " [{small},0,0] Assertion `t >= 0 && t < n_classes` failed.\nRuntimeError: CUDA error:"
        " device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side"
        " assertions.",
        "RuntimeError: Caught ValueError in DataLoader worker process 0.",
        "AttributeError: '{cls}' object has no attribute '{var}'. Did you mean: '{var2}'?",
        "TypeError: forward() takes 2 positional arguments but 3 were given",
        "NotImplementedError: Module [{cls}] is missing the required \"forward\" function",
        "NameError: name '{var}' is not defined",
        "NameError: name '{var}' is not defined. Did you mean: '{var2}'?",
        "AttributeError: '{cls}' object has no attribute '{var}'",
        "AttributeError: 'NoneType' object has no attribute '{var}'",
        "AttributeError: module '{mod}' has no attribute '{var}'",
        "TypeError: {func}() missing 1 required positional argument: '{var}'",
        "TypeError: unsupported operand type(s) for +: 'int' and 'NoneType'",
        "TypeError: 'NoneType' object is not subscriptable",
        "TypeError: object of type 'NoneType' has no len()",
        "TypeError: '{cls}' object is not callable",
        "TypeError: can only concatenate str (not \"int\") to str",
        "TypeError: list indices must be integers or slices, not str",
        "ValueError: too many values to unpack (expected {small})",
        "ValueError: not enough values to unpack (expected {small}, got 1)",
        "ValueError: invalid literal for int() with base 10: '{var}'",
        "ValueError: too many dimensions 'str'",
        "KeyError: '{var}'",
        "KeyError: {n}",
        "IndexError: list index out of range",
        "IndexError: index {n} is out of bounds for dimension 0 with size {small}",
        "IndexError: tuple index out of range",
        "UnboundLocalError: local variable '{var}' referenced before assignment",
        "UnboundLocalError: cannot access local variable '{var}' where it is not associated with"
        " a value",
        "ZeroDivisionError: division by zero",
        "RecursionError: maximum recursion depth exceeded while calling a Python object",
        "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
        "AssertionError",
        "AssertionError: {var} should not be empty",
        "StopIteration",
    ],
    "import_error": [
        "ModuleNotFoundError: No module named '{mod}'",
        "ModuleNotFoundError: No module named '{mod}.{var}'",
        "ImportError: cannot import name '{cls}' from '{mod}' ({path}/__init__.py)",
        "ImportError: cannot import name '{var}' from partially initialized module '{mod}'"
        " (most likely due to a circular import)",
        "ImportError: {path}/{var}_cuda.cpython-310-x86_64-linux-gnu.so: undefined symbol:"
        " _ZN3c104cuda{n}CUDAStream",
        "OSError: {path}/libtorch_cuda.so: undefined symbol: cudaGraphDebugDotPrint, version"
        " libcudart.so.11.0",
        "ImportError: libcudart.so.{small}.0: cannot open shared object file: No such file or"
        " directory",
        "ImportError: libGL.so.1: cannot open shared object file: No such file or directory",
        "ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.{small}' not"
        " found",
        "ImportError: numpy.core.multiarray failed to import",
        "ValueError: numpy.dtype size changed, may indicate binary incompatibility. Expected 96"
        " from C header, got 88 from PyObject",
        "ImportError: This modeling file requires the following packages that were not found in"
        " your environment: {mod}. Run `pip install {mod}`",
        "ImportError: Using the `Trainer` with `PyTorch` requires `accelerate>=0.{small}.0`:"
        " Please run `pip install transformers[torch]`",
        "RuntimeError: Detected that PyTorch and torchvision were compiled with different CUDA"
        " major versions. PyTorch has CUDA Version=11.8 and torchvision has CUDA Version=12.1.",
        "ImportError: DLL load failed while importing _C: The specified module could not be"
        " found.",
        "!A module that was compiled using NumPy 1.x cannot be run in NumPy 2.0.{small} as it"
        " may crash. To support both 1.x and 2.x versions of NumPy, modules must be compiled"
        " with NumPy 2.0.",
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        "ImportError: tensorflow/python/_pywrap_tensorflow_internal.so: undefined symbol:"
        " _ZN10tensorflow{n}",
        "jaxlib.xla_extension.XlaRuntimeError: FAILED_PRECONDITION: DNN library initialization"
        " failed. Look at the errors above for more details.",
        "!The installed version of bitsandbytes was compiled without GPU support.",
        "RuntimeError: Failed to import transformers.models.{var} because of the following"
        " error (look up to see its traceback):",
    ],
    "shape_dtype_device_mismatch": [
        "ValueError: operands could not be broadcast together with shapes ({dim},{dim2}) ({dim2},)",
        "TypeError: add got incompatible shapes for broadcasting: ({dim}, {dim2}), ({n}, {dim2}).",
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied ({n}x{dim} and {dim2}x{n2})",
        "RuntimeError: The size of tensor a ({dim}) must match the size of tensor b ({dim2}) at"
        " non-singleton dimension {small}",
        "RuntimeError: Expected all tensors to be on the same device, but found at least two"
        " devices, cuda:{small} and cpu!",
        "RuntimeError: Error(s) in loading state_dict for {cls}:\n\tsize mismatch for"
        " {var}.weight: copying a param with shape torch.Size([{dim}, {dim2}]) from checkpoint,"
        " the shape in current model is torch.Size([{n}, {dim2}]).",
        "RuntimeError: Error(s) in loading state_dict for {cls}:\n\tMissing key(s) in"
        " state_dict: \"{var}.weight\", \"{var}.bias\".\n\tUnexpected key(s) in state_dict:"
        " \"module.{var}.weight\".",
        "RuntimeError: expected scalar type Float but found Half",
        "RuntimeError: expected scalar type Long but found Float",
        "RuntimeError: Found dtype Long but expected Float",
        "RuntimeError: result type Float can't be cast to the desired output type long int",
        "RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor)"
        " should be the same",
        "RuntimeError: Given groups=1, weight of size [{dim}, 3, 7, 7], expected input[{small},"
        " 1, 224, 224] to have 3 channels, but got 1 channels instead",
        "ValueError: Expected input batch_size ({dim}) to match target batch_size ({dim2}).",
        "RuntimeError: shape '[{small}, {dim}]' is invalid for input of size {n}",
        "tensorflow.python.framework.errors_impl.InvalidArgumentError: Incompatible shapes:"
        " [{small},{dim}] vs. [{small},{dim2}]",
        "ValueError: Input 0 of layer \"{var}\" is incompatible with the layer: expected"
        " shape=(None, {dim}), found shape=(None, {dim2})",
        "TypeError: dot_general requires contracting dimensions to have the same shape, got"
        " ({dim},) and ({dim2},).",
        "RuntimeError: Tensor for argument #2 'mat1' is on CPU, but expected it to be on GPU"
        " (while checking arguments for addmm)",
        "RuntimeError: Expected tensor for argument #1 'indices' to have one of the following"
        " scalar types: Long, Int; but got torch.cuda.FloatTensor instead",
        "TypeError: can't convert cuda:{small} device type tensor to numpy. Use Tensor.cpu() to"
        " copy the tensor to host memory first.",
        "ValueError: Target size (torch.Size([{dim}])) must be the same as input size"
        " (torch.Size([{dim}, {small}]))",
    ],
    "config_error": [
        "RuntimeError: CUDA error: invalid device ordinal",
        "ValueError: Error initializing torch.distributed using env:// rendezvous: environment"
        " variable RANK expected, but not set",
        "ValueError: {var} must be divisible by tensor_model_parallel_size ({small})",
        "absl.flags._exceptions.IllegalFlagValueError: flag --{var}={var2}: invalid value",
        "AssertionError: micro_batch_size * data_parallel_size must divide global_batch_size",
        "!{script}: error: unrecognized arguments: --{var} {n}",
        "!{script}: error: the following arguments are required: --{var}",
        "!{script}: error: argument --{var}: invalid int value: '{var2}'",
        "!{script}: error: argument --{var}: invalid choice: '{var2}' (choose from 'adam', 'sgd')",
        "ValueError: Invalid learning rate: -{small}e-4",
        "AssertionError: global batch size {n} must be divisible by world size {small}",
        "ValueError: Error initializing torch.distributed using env:// rendezvous: environment"
        " variable MASTER_ADDR expected, but not set",
        "KeyError: 'LOCAL_RANK'",
        "omegaconf.errors.ConfigAttributeError: Key '{var}' is not in struct",
        "hydra.errors.ConfigCompositionException: Could not override '{var}.{var2}'. No match"
        " in config.",
        "ValueError: Unknown scheduler type: {var}. Choose from linear, cosine",
        "KeyError: '{cls} is not in the model registry. Please check whether the value of"
        " `{cls}` is correct or it was registered as expected.'",
        "RuntimeError: Distributed package doesn't have NCCL built in",
        "ValueError: fp16 mixed precision requires a GPU (not 'cpu').",
        "Exception: Request failed: 404, {{\"detail\":\"Not Found\"}}",
        "yaml.scanner.ScannerError: mapping values are not allowed here",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for {cls}Config",
        "ValueError: --{var} must be a positive integer, got {var2}",
        "lightning_fabric.utilities.exceptions.MisconfigurationException: You requested gpu:"
        " [0, 1, 2, 3] But your machine only has: [0]",
        "ValueError: `num_beams` has to be an integer strictly greater than 1, but is 0.",
        "AssertionError: Unsupported model type '{var}' in config",
        "ValueError: Tokenizer class {cls}Tokenizer does not exist or is not currently imported.",
        "deepspeed.runtime.config.DeepSpeedConfigError: Check batch related parameters."
        " train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size"
        " {n} != {small} * 1 * {small}",
    ],
    "missing_file_or_permission": [
        "FileNotFoundError: Unable to find '{path}/{file}'",
        "OSError: {var}/{var2} is not a local folder and is not a valid model identifier listed on"
        " 'https://huggingface.co/models'",
        "FileNotFoundError: [Errno 2] No such file or directory: '{path}/{file}'",
        "PermissionError: [Errno 13] Permission denied: '{path}/{file}'",
        "IsADirectoryError: [Errno 21] Is a directory: '{path}'",
        "OSError: [Errno 30] Read-only file system: '{path}/{file}'",
        "OSError: Can't load config for '{path}'. Make sure that:\n\n- '{path}' is a correct"
        " model identifier listed on 'https://huggingface.co/models'\n\n- or '{path}' is the"
        " correct path to a directory containing a config.json file",
        "OSError: Error no file named pytorch_model.bin, model.safetensors, tf_model.h5 found in"
        " directory {path}.",
        "FileNotFoundError: Dataset '{file}' for task=detect not found",
        "tensorflow.python.framework.errors_impl.NotFoundError: {path}/{file}; No such file or"
        " directory",
        "AssertionError: Image Not Found {path}/{file}",
        "FileNotFoundError: Couldn't find a dataset script at {path}/{var}.py or any data file"
        " in the same directory.",
        "ValueError: checkpoint path {path}/{file} does not exist",
        "!{script}: can't open file '{path}/{script}': [Errno 2] No such file or directory",
        "!/bin/bash: {path}/{file}: No such file or directory",
        "OSError: Unable to open file (unable to open file: name = '{path}/{file}', errno = 2,"
        " error message = 'No such file or directory', flags = 0, o_flags = 0)",
        "FileNotFoundError: [WinError 3] The system cannot find the path specified: '{path}'",
    ],
    "gpu_out_of_memory": [
        "!{host}:{pid}:{pid} [{rank}] NCCL WARN Cuda failure 'out of memory'",
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Attempting to reserve {gib2}G at"
        " the bottom of memory. That was not possible. There are {gib}G free.",
        "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {mem} MiB (GPU"
        " {small}; {gib} GiB total capacity; {gib2} GiB already allocated; {mem2} MiB free;"
        " {gib2} GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try"
        " setting max_split_size_mb to avoid fragmentation.  See documentation for Memory"
        " Management and PYTORCH_CUDA_ALLOC_CONF",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {gib2} GiB. GPU {small}"
        " has a total capacity of {gib} GiB of which {mem2} MiB is free. Including non-PyTorch"
        " memory, this process has {gib} GiB memory in use. Of the allocated memory {gib2} GiB"
        " is allocated by PyTorch, and {mem} MiB is reserved by PyTorch but unallocated.",
        "RuntimeError: CUDA out of memory. Tried to allocate {mem} MiB (GPU {small}; {gib} GiB"
        " total capacity; {gib2} GiB already allocated; {mem2} MiB free; {gib2} GiB reserved in"
        " total by PyTorch)",
        "RuntimeError: CUDA error: out of memory",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {gib2} GiB. GPU",
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating"
        " tensor with shape[{small},{dim},{dim2}] and type float on"
        " /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying"
        " to allocate {n} bytes.",
        "RuntimeError: HIP out of memory. Tried to allocate {mem} MiB (GPU {small}; {gib} GiB"
        " total capacity; {gib2} GiB already allocated)",
        "!2024-{n} W tensorflow/core/common_runtime/bfc_allocator.cc:479] Allocator (GPU_0_bfc)"
        " ran out of memory trying to allocate {gib2}GiB (rounded to {n})requested by op MatMul",
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {mem} MiB. GPU"
        " {small} has a total capacty of {gib} GiB of which {mem2} MiB is free.",
    ],
    "framework_api_misuse": [
        "RuntimeError: NCCL error in: {path}/ProcessGroupNCCL.cpp:{line}, invalid usage, NCCL"
        " version 2.{small}.8\nncclInvalidUsage: This usually reflects invalid usage of NCCL"
        " library.",
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running"
        " collective: CollectiveFingerPrint(OpType=ALLREDUCE), but Rank 1 is running collective:"
        " CollectiveFingerPrint(OpType=BROADCAST).",
        "RuntimeError: Tensors must be CUDA and dense",
        "ValueError: Your setup doesn't support bf16/gpu. You need torch>=1.10, using Ampere GPU"
        " with cuda>=11.0",
        "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn",
        "RuntimeError: Trying to backward through the graph a second time (or directly access"
        " saved tensors after they have already been freed). Saved intermediate values of the"
        " graph are freed when you call .backward() or autograd.grad(). Specify"
        " retain_graph=True if you need to backward through the graph a second time.",
        "RuntimeError: one of the variables needed for gradient computation has been modified"
        " by an inplace operation: [torch.cuda.FloatTensor [{dim}, {dim2}]], which is output 0"
        " of ReluBackward0, is at version {small}; expected version 1 instead. Hint: enable"
        " anomaly detection to find the operation that failed to compute its gradient, with"
        " torch.autograd.set_detect_anomaly(True).",
        "RuntimeError: Expected to have finished reduction in the prior iteration before"
        " starting a new one. This error indicates that your module has parameters that were"
        " not used in producing loss. You can enable unused parameter detection by passing the"
        " keyword argument `find_unused_parameters=True` to"
        " `torch.nn.parallel.DistributedDataParallel`",
        "RuntimeError: Can't call numpy() on Tensor that requires grad. Use"
        " tensor.detach().numpy() instead.",
        "RuntimeError: Default process group has not been initialized, please make sure to call"
        " init_process_group.",
        "ValueError: Attempting to unscale FP16 gradients.",
        "RuntimeError: a leaf Variable that requires grad is being used in an in-place"
        " operation.",
        "TypeError: {cls}.__init__() got an unexpected keyword argument '{var}'",
        "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with"
        " multiprocessing, you must use the 'spawn' start method",
        "RuntimeError: DDP expects same model across all ranks, but Rank 0 has {n} params,"
        " while rank 1 has inconsistent {n2} params.",
        "ValueError: tf.function only supports singleton tf.Variables created on the first"
        " call. Make sure the tf.Variable is only created once or created outside tf.function.",
        "jax.errors.ConcretizationTypeError: Abstract tracer value encountered where concrete"
        " value is expected: traced array with shape int32[]",
        "jax.errors.TracerArrayConversionError: The numpy.ndarray conversion method __array__()"
        " was called on traced array with shape float32[{dim}]",
        "AssertionError: No inf checks were recorded for this optimizer.",
        "RuntimeError: grad can be implicitly created only for scalar outputs",
        "RuntimeError: Expected a 'cuda' device type for generator but found 'cpu'",
        "horovod.common.exceptions.HorovodInternalError: Horovod has not been initialized; use"
        " hvd.init().",
        "AssertionError: DeepSpeed backward pass with ZeRO stage 3 requires engine.backward()"
        " instead of loss.backward()",
        "RuntimeError: You must call `accelerator.prepare` on the model before training",
    ],
    "numerical_error": [
        "!WARNING: non-finite loss, ending training",
        "RuntimeError: Rank {rank}: loss is NaN at iteration {n2}",
        "ValueError: loss is nan",
        "AssertionError: loss is NaN",
        "RuntimeError: Function 'LogSoftmaxBackward0' returned nan values in its 0th output.",
        "RuntimeError: Function 'MulBackward0' returned nan values in its 1th output.",
        "!Loss is inf, stopping training",
        "!Loss is nan, stopping training",
        "FloatingPointError: Minimum loss scale reached ({small}e-4). Your loss is probably"
        " exploding. Try lowering the learning rate, using gradient clipping or increasing the"
        " batch size.",
        "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0",
        "ValueError: Input contains NaN, infinity or a value too large for dtype('float32').",
        "tensorflow.python.framework.errors_impl.InvalidArgumentError: {var} : Tensor had NaN"
        " values",
        "ValueError: The loss returned in `training_step` is nan.",
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore."
        " Exiting run.",
        "FloatingPointError: invalid value (nan) encountered in mul",
        "RuntimeError: Loss diverged: loss={n}e+{small} at step {n2}",
        "AssertionError: Non-finite loss detected: inf",
    ],
}

MESSAGES: dict[str, list[str]] = {**_DETERMINISTIC, **TRANSIENT_MESSAGES}
