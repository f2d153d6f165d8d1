"""Messages of the nondeterministic categories: the environment failed, not the job.

Part of the generator's message table (see :mod:`.synthetic_messages` for the template rules).
"""

from __future__ import annotations

__all__ = ["TRANSIENT_MESSAGES"]

TRANSIENT_MESSAGES: dict[str, list[str]] = {
    "collective_timeout": [
        "RuntimeError: Timed out initializing process group in store based barrier on rank: {rank},"
        " for key: store_based_barrier_key:1 (world_size={world}, worker_count={small},"
        " timeout=0:30:00)",
        "RuntimeError: [{path}/gloo/transport/tcp/unbound_buffer.cc:133] Timed out waiting"
        " {timeout}ms for send operation to complete",
        "![E ProcessGroupNCCL.cpp:{line}] [Rank {rank}] Watchdog caught collective operation"
        " timeout: WorkNCCL(SeqNum={n}, OpType={op}, Timeout(ms)={timeout}) ran for {n2}"
        " milliseconds before timing out.",
        "![rank{rank}]:[E{mmdd} {hms} ProcessGroupNCCL.cpp:{line}] [Rank {rank}] Watchdog caught"
        " collective operation timeout: WorkNCCL(SeqNum={n}, OpType={op}, NumelIn={n2},"
        " NumelOut={n2}, Timeout(ms)={timeout}) ran for {n} milliseconds before timing out.",
        "![E ProcessGroupNCCL.cpp:{line}] Some NCCL operations have failed or timed out. Due to"
        " the asynchronous nature of CUDA kernels, subsequent GPU operations might run on"
        " corrupted/incomplete data.\n[E ProcessGroupNCCL.cpp:{line}] To avoid data"
        " inconsistency, we are taking the entire process down.",
        "!terminate called after throwing an instance of 'std::runtime_error'\n  what():  [Rank"
        " {rank}] Watchdog caught collective operation timeout: WorkNCCL(OpType={op},"
        " Timeout(ms)={timeout}) ran for {n} milliseconds before timing out.",
        "![rank{rank}]:[E{mmdd} {hms} ProcessGroupNCCL.cpp:{line}] [PG 0 Rank {rank}] Timeout at"
        " NCCL work: {small}, last enqueued NCCL work: {small}, last completed NCCL work: 1.",
        "RuntimeError: [{path}/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting"
        " {timeout}ms for recv operation to complete",
        "torch.distributed.DistBackendError: [Rank {rank}] Watchdog caught collective operation"
        " timeout: WorkNCCL(SeqNum={n}, OpType={op}, Timeout(ms)={timeout}) ran for {n2}"
        " milliseconds before timing out.",
        "!One or more tensors were submitted to be reduced, gathered or broadcasted by subset of"
        " ranks and are waiting for remainder of ranks for more than 60 seconds. This may"
        " indicate that different ranks are trying to submit different tensors or that only"
        " subset of ranks is submitting tensors, which will cause deadlock.\nMissing ranks:\n"
        "{rank}: [allreduce.grad_{var}]",
        "jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Id:"
        " PjRT_Client_Connect::{var}. This usually happens because a task triggered the barrier"
        " too early or too slowly.",
        "!{host}:{pid}:{pid} [{rank}] NCCL INFO [Service thread] Connection closed by localRank"
        " {rank}\n[E ProcessGroupNCCL.cpp:{line}] [Rank {rank}] NCCL watchdog thread terminated"
        " with exception: [Rank {rank}] Watchdog caught collective operation timeout:"
        " WorkNCCL(SeqNum={n}, OpType={op}, Timeout(ms)={timeout}) ran for {n2} milliseconds"
        " before timing out.",
        "RuntimeError: NCCL communicator was aborted on rank {rank}. Original reason for"
        " failure was: [Rank {rank}] Watchdog caught collective operation timeout",
        "tensorflow.python.framework.errors_impl.DeadlineExceededError: Collective ops is"
        " aborted by: Deadline Exceeded",
    ],
    "nccl_network_error": [
        "RuntimeError: NCCL error in: {path}/ProcessGroupNCCL.cpp:{line}, unhandled system"
        " error, NCCL version 2.{small}.3\nncclSystemError: System call (e.g. socket, malloc) or"
        " external library call failed or device error.\nLast error:\nsocketStartConnect:"
        " Connect to {ip}<{port}> failed : Software caused connection abort",
        "torch.distributed.DistBackendError: NCCL error in: {path}/NCCLUtils.hpp:{line}, remote"
        " process exited or there was a network error, NCCL version 2.{small}.3\nncclRemoteError:"
        " A call failed possibly due to a network error or a remote process exiting"
        " prematurely.\nLast error:\nNET/IB : Got completion from peer {ip}<{port}> with error"
        " 12, opcode 0, len 0, vendor err 129 (Recv)",
        "!{host}:{pid}:{pid} [{rank}] transport/net_ib.cc:{line} NCCL WARN NET/IB : Got"
        " completion from peer {ip}<{port}> with error 12, opcode 1, len 32768, vendor err 129",
        "!{host}:{pid}:{pid} [{rank}] misc/ibvwrap.cc:{line} NCCL WARN Call to ibv_create_qp"
        " failed with error Cannot allocate memory",
        "!{host}:{pid}:{pid} [{rank}] misc/ibvwrap.cc:{line} NCCL WARN Call to ibv_modify_qp"
        " failed with error Connection timed out",
        "!{host}:{pid}:{pid} [{rank}] NCCL WARN NET/Socket : recv returned 0",
        "!{host}:{pid}:{pid} [{rank}] include/socket.h:{line} NCCL WARN Net : Connection closed"
        " by remote peer {ip}<{port}>",
        "RuntimeError: NCCL error in: {path}/ProcessGroupNCCL.cpp:{line}, unhandled system error",
        "RuntimeError: NCCL communicator was aborted on rank {rank}. Original reason for"
        " failure was: NCCL error: unhandled system error, NCCL version 2.{small}.3",
        "horovod.common.exceptions.HorovodInternalError: ncclCommInitRank failed: unhandled"
        " system error",
        "RuntimeError: NCCL error in: {path}/ProcessGroupNCCL.cpp:{line}, internal error, NCCL"
        " version 2.{small}.3\nncclInternalError: Internal check failed.",
        "!{host}:{pid}:{pid} [{rank}] transport/net_socket.cc:{line} NCCL WARN NET/Socket :"
        " socket progress error",
        "!{host}:{pid}:{pid} [{rank}] NCCL WARN NET/IB : Got async event : port error",
    ],
    "connection_error": [
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the"
        " C10d store has failed. See inner exception for details.",
        "OSError: [Errno 113] No route to host",
        "ConnectionAbortedError: [Errno 103] Software caused connection abort",
        "torch.distributed.DistBackendError: [{rank}] is setting up NCCL communicator and"
        " retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but"
        " store->get('0') got error: Connection reset by peer",
        "ConnectionResetError: [Errno 104] Connection reset by peer",
        "ConnectionRefusedError: [Errno 111] Connection refused",
        "RuntimeError: Connection reset by peer",
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local"
        " network address. The server socket has failed to bind to [::]:{port} (errno: 98 -"
        " Address already in use).",
        "RuntimeError: Address already in use",
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
        "torch.distributed.DistStoreError: Timed out after {small}01 seconds waiting for clients."
        " {small}/{world} clients joined.",
        "TimeoutError: The client socket has timed out after {timeout}ms while trying to connect"
        " to ({ip}, {port}).",
        "![W socket.cpp:{line}] [c10d] The client socket has failed to connect to [{host}]:{port}"
        " (errno: 110 - Connection timed out).",
        "BrokenPipeError: [Errno 32] Broken pipe",
        "socket.gaierror: [Errno -2] Name or service not known",
        "socket.gaierror: [Errno -3] Temporary failure in name resolution",
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='{domain}', port=443): Max"
        " retries exceeded with url: /{var} (Caused by NewConnectionError('<urllib3.connection."
        "HTTPSConnection object at {hexaddr}>: Failed to establish a new connection: [Errno 101]"
        " Network is unreachable'))",
        "urllib.error.URLError: <urlopen error [Errno 110] Connection timed out>",
        "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:\n"
        "\tstatus = StatusCode.UNAVAILABLE\n\tdetails = \"failed to connect to all addresses\">",
        "RuntimeError: Gloo connectFullMesh failed with [{path}/gloo/transport/tcp/pair.cc:144]"
        " no error",
        "RuntimeError: [{path}/gloo/transport/tcp/pair.cc:598] Connection closed by peer"
        " [{ip}]:{port}",
        "![E socket.cpp:{line}] [c10d] The server socket has failed to listen on any local"
        " network address.",
        "urllib3.exceptions.ProtocolError: ('Connection aborted.', ConnectionResetError(104,"
        " 'Connection reset by peer'))",
        "torch.distributed.DistStoreError: Socket Timeout",
        "ConnectionError: Connection to {host}:{port} lost",
    ],
    "gpu_hardware_error": [
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions"
        " before calling NumCudaDevices() that might have already set an error? Error 802: system"
        " not yet initialized",
        "!Unable to determine the device handle for GPU: GPU is lost. Reboot the system to recover"
        " this GPU",
        "!{host}:{pid}:{pid} [{rank}] NCCL WARN Cuda failure 'unspecified launch failure'",
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "RuntimeError: CUDA error: unspecified launch failure",
        "RuntimeError: CUDA error: unknown error",
        "RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable",
        "RuntimeError: CUDA error: the launch timed out and was terminated",
        "!NVRM: Xid (PCI:0000:{pcibus}:00): 79, pid={pid}, GPU has fallen off the bus.",
        "!NVRM: Xid (PCI:0000:{pcibus}:00): 48, pid={pid}, An uncorrectable double bit error"
        " (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 1.",
        "!NVRM: Xid (PCI:0000:{pcibus}:00): 74, pid={pid}, NVLink: fatal error detected on"
        " link {small}",
        "RuntimeError: CUDA driver error: unknown error",
        "RuntimeError: No CUDA GPUs are available",
        "!Unable to determine the device handle for GPU 0000:{pcibus}:00.0: Unknown Error",
        "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: CUDA error: :"
        " CUDA_ERROR_ECC_UNCORRECTABLE: uncorrectable ECC error encountered",
        "RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution",
        "!terminate called after throwing an instance of 'c10::CUDAError'\n  what():  CUDA error:"
        " unspecified launch failure",
        "tensorflow.python.framework.errors_impl.InternalError: CUDA runtime implicit"
        " initialization on GPU:0 failed. Status: device kernel image is invalid... ECC error",
        "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
        "!Error in thread 0: CUDA runtime API error cudaErrorLaunchFailure (719): unspecified"
        " launch failure",
    ],
    "node_failure_or_preemption": [
        "!srun: error: Task launch for StepId={n}.0 failed on node {host}: Communication connection"
        " failure",
        "ray.exceptions.NodeDiedError: Task failed due to the node dying.",
        "!Signal 9 (SIGKILL) received by PID {pid}",
        "!slurmstepd: error: *** JOB {n} ON {host} CANCELLED AT {iso} DUE TO NODE FAILURE ***",
        "!slurmstepd: error: *** STEP {n}.0 ON {host} CANCELLED AT {iso} DUE TO PREEMPTION ***",
        "!slurmstepd: error: *** JOB {n} ON {host} CANCELLED AT {iso} DUE TO TIME LIMIT ***",
        "!srun: error: Node failure on {host}",
        "!srun: error: {host}: task {rank}: Killed",
        "!Killed",
        "!WARNING:torch.distributed.elastic.agent.server.api:Received 15 death signal, shutting"
        " down workers",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process {pid} got"
        " signal: 15",
        "!ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank:"
        " {rank} (pid: {pid}) of binary: {path}/python",
        "!The node was low on resource: memory. Container trainer was using {gib}Gi, which"
        " exceeds its request of 0. Pod evicted.",
        "!Preempted by a higher priority pod: pod {var}-{n} was evicted",
        "!mpirun noticed that process rank {rank} with PID {pid} on node {host} exited on signal"
        " 9 (Killed).",
        "!Terminated",
        "!Received SIGTERM: the instance is being preempted (spot interruption notice)",
        "!Lost heartbeat from node {host}; marking it dead and restarting the job",
        "!slurmstepd: error: *** JOB {n} STEPD TERMINATED ON {host} AT {iso} DUE TO JOB NOT"
        " ENDING WITH SIGNALS ***",
    ],
    "filesystem_io_error": [
        "OSError: [Errno 110] Connection timed out: '{path}/{file}'",
        "OSError: [Errno 116] Stale file handle",
        "OSError: [Errno 116] Stale file handle: '{path}/{file}'",
        "OSError: [Errno 5] Input/output error: '{path}/{file}'",
        "OSError: [Errno 5] Input/output error",
        "OSError: [Errno 107] Transport endpoint is not connected: '{path}'",
        "!nfs: server {host} not responding, still trying",
        "!LustreError: 11-0: {var}-MDT0000-mdc: operation ldlm_enqueue to node {ip}@o2ib failed:"
        " rc = -107",
        "OSError: Unable to open file (file read failed: time = Mon Mar  4 10:00:00 2024, errno"
        " = 5, error message = 'Input/output error', buf = {hexaddr}, total read size = {n})",
        "OSError: [Errno 112] Host is down: '{path}'",
        "BlockingIOError: [Errno 11] Unable to create file (unable to lock file, errno = 11,"
        " error message = 'Resource temporarily unavailable')",
        "RuntimeError: PytorchStreamReader failed reading file data/{n}: file read failed",
        "!gcsfuse: ReadFile: input/output error, fh.reader.ReadAt: readFull: context deadline"
        " exceeded",
        "OSError: [Errno 121] Remote I/O error",
        "!ls: cannot access '{path}': Transport endpoint is not connected",
        "tensorflow.python.framework.errors_impl.UnavailableError: Error executing an HTTP"
        " request: libcurl code 28 meaning 'Timeout was reached', reading gs://{var}/{file}",
    ],
    "remote_service_error": [
        "requests.exceptions.ChunkedEncodingError: ('Connection broken: IncompleteRead({n} bytes"
        " read, {n2} more expected)', IncompleteRead({n} bytes read))",
        "huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate"
        " the file on the Hub and we cannot find the requested files in the local cache.",
        "http.client.RemoteDisconnected: Remote end closed connection without response",
        "requests.exceptions.HTTPError: 503 Server Error: Service Unavailable for url: {url}",
        "huggingface_hub.utils._errors.HfHubHTTPError: 504 Server Error: Gateway Time-out for"
        " url: {url}",
        "requests.exceptions.HTTPError: 429 Client Error: Too Many Requests for url: {url}",
        "requests.exceptions.ReadTimeout: HTTPSConnectionPool(host='{domain}', port=443): Read"
        " timed out. (read timeout=10)",
        "ConnectionError: Couldn't reach {url} (error 502)",
        "ConnectionError: Couldn't reach {url}",
        "botocore.exceptions.ClientError: An error occurred (SlowDown) when calling the"
        " PutObject operation (reached max retries: 4): Please reduce your request rate.",
        "botocore.exceptions.ClientError: An error occurred (503) when calling the GetObject"
        " operation: Service Unavailable",
        "google.api_core.exceptions.TooManyRequests: 429 GET {url}: rate limit exceeded",
        "!wandb: ERROR Error while calling W&B API: An internal error occurred. Please contact"
        " support. (<Response [502]>)",
        "wandb.errors.CommError: Error communicating with wandb process (500 Internal Server"
        " Error)",
        "OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't"
        " find it in the cached files and it looks like {var}/{var2} is not the path to a"
        " directory containing a file named config.json.",
        "urllib.error.HTTPError: HTTP Error 503: Service Unavailable",
        "huggingface_hub.errors.HfHubHTTPError: 500 Server Error: Internal Server Error for url:"
        " {url}",
        "![{iso} WARNING] '(ReadTimeoutError(\"HTTPSConnectionPool(host='{domain}', port=443):"
        " Read timed out. (read timeout=10)\"), '(Request ID: {uuid})')' thrown while requesting"
        " HEAD {url}\n[{iso} WARNING] Retrying in 1s [Retry 1/5].",
        "botocore.exceptions.ReadTimeoutError: Read timeout on endpoint URL: \"{url}\"",
        "aiohttp.client_exceptions.ClientResponseError: 502, message='Bad Gateway', url={url}",
    ],
}
