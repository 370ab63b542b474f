# Included by ggml.pyx: ggml's RPC backend (ggml-rpc), the client side (remote
# devices) and the server side (this machine's devices served to others).
#
# The protocol is llama.cpp's own (same ggml), so either side can be llama.cpp's
# rpc-server or llama-server --rpc. It has no authentication.
import socket as _socket
import struct as _struct

from libc.stdio cimport fflush
from libc.string cimport strncpy, strstr
from posix.unistd cimport _exit, sleep

ctypedef ggml_backend_reg_t (*rpc_add_server_t)(const char * endpoint) noexcept nogil
ctypedef void (*rpc_start_server_t)(const char * endpoint, const char * cache_dir, size_t n_threads,
                                    size_t n_devices, ggml_backend_dev_t * devices) noexcept nogil

RPC_PORT = 50052           # llama.cpp's rpc-server default
_RPC_CMD_HELLO = 14        # ggml-rpc.cpp: "RPC_CMD_HELLO must be always 14"
_RPC_CONN_CAPS_SIZE = 24   # ggml-rpc/transport.h

cdef char _rpc_lost[1024]
cdef bint _rpc_lost_set = False
cdef bint _rpc_exit_on_loss = True


cdef void _on_abort(const char * message) noexcept nogil:
    """ggml aborts the process when an RPC worker stops answering (ggml-rpc.cpp's
    RPC_STATUS_ASSERT, on the dispatcher thread of that worker). By default that
    becomes a plain exit with status 1. After rpc_exit_on_loss(False) (a server that
    fails its requests and reports the loss, `rpc_lost`) the thread is parked for
    good instead: the call waiting for it never returns, the process lives on.
    Every other abort stays an abort."""
    global _rpc_lost_set
    fputs(message, stderr)
    fputs("\n", stderr)
    if strstr(message, "ggml-rpc") == NULL:
        return                      # ggml calls abort() next
    if _rpc_exit_on_loss:
        fflush(stderr)
        _exit(1)
    if not _rpc_lost_set:
        strncpy(_rpc_lost, message, sizeof(_rpc_lost) - 1)
        _rpc_lost_set = True
    while True:
        sleep(3600)


def rpc_exit_on_loss(bint on):
    """Whether losing a worker ends the process (status 1, ggml's message; the
    default) or parks the thread that noticed (see _on_abort). Returns the old value."""
    global _rpc_exit_on_loss
    old, _rpc_exit_on_loss = _rpc_exit_on_loss, on
    return old


def rpc_lost():
    """ggml's message when an RPC worker was lost (the process cannot use its
    devices any more), else None."""
    return (<bytes>_rpc_lost).decode(errors="replace") if _rpc_lost_set else None


cdef ggml_backend_reg_t _rpc_reg() except NULL:
    cdef ggml_backend_reg_t reg = ggml_backend_reg_by_name(b"RPC")
    if reg == NULL:
        raise GGMLError("the linked ggml was built without its RPC backend (scripts/build_ggml.sh: GGML_RPC=ON)")
    return reg


def split_endpoint(str endpoint):
    """'host:port' -> (host, port); a clear ValueError otherwise."""
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"RPC endpoint {endpoint!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def rpc_hello(str endpoint, float timeout=5.0):
    """The worker's protocol version (major, minor, patch) from the RPC handshake,
    on a connection of its own. Raises ConnectionError naming the endpoint when
    nothing answers there or the version cannot talk to this ggml."""
    host, port = split_endpoint(endpoint)
    try:
        with _socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(_struct.pack("<BQ", _RPC_CMD_HELLO, _RPC_CONN_CAPS_SIZE) + bytes(_RPC_CONN_CAPS_SIZE))
            head = _recv_exact(s, 8)
            size = _struct.unpack("<Q", head)[0]
            major, minor, patch = _recv_exact(s, size)[:3]
    except (OSError, ValueError) as e:
        why = "no answer to the handshake (is it serving another client?)" if isinstance(e, _socket.timeout) else e
        raise ConnectionError(f"RPC worker {endpoint} is unreachable: {why}") from None
    if major != RPC_PROTO_MAJOR_VERSION or minor > RPC_PROTO_MINOR_VERSION:
        raise ConnectionError(f"RPC worker {endpoint} speaks protocol {major}.{minor}.{patch}; this ggml speaks "
                              f"{RPC_PROTO_MAJOR_VERSION}.{RPC_PROTO_MINOR_VERSION}.x")
    return major, minor, patch


def _recv_exact(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ValueError("the connection closed during the handshake")
        out += chunk
    return out


cdef list _rpc_devices(list endpoints):
    """The devices of each worker, in the order given (as llama.cpp lists them).
    Each endpoint is checked first (rpc_hello): ggml itself aborts on one it cannot reach."""
    cdef rpc_add_server_t add_server = <rpc_add_server_t>ggml_backend_reg_get_proc_address(
        _rpc_reg(), b"ggml_backend_rpc_add_server")
    cdef ggml_backend_reg_t reg
    cdef size_t i
    for endpoint in endpoints:
        rpc_hello(endpoint)
    ggml_set_abort_callback(_on_abort)
    out = []
    for endpoint in endpoints:
        was = rpc_exit_on_loss(True)        # an error at start is an exit, whatever the mode
        reg = add_server(endpoint.encode())
        rpc_exit_on_loss(was)
        if reg == NULL:
            raise GGMLError(f"RPC worker {endpoint} offers no device")
        for i in range(ggml_backend_reg_dev_count(reg)):
            out.append((endpoint, <uintptr_t>ggml_backend_reg_dev_get(reg, i)))
    return out


def rpc_start_server(str endpoint, list device_names=None, int n_threads=1, str cache_dir=None):
    """Serve this machine's devices at endpoint until the process ends (blocks; the
    GIL is released). Devices: those named, else every GPU, else the CPU (as
    llama.cpp's rpc-server chooses)."""
    cdef rpc_start_server_t start = <rpc_start_server_t>ggml_backend_reg_get_proc_address(
        _rpc_reg(), b"ggml_backend_rpc_start_server")
    cdef ggml_backend_dev_t[16] devs
    cdef size_t n = 0, i
    cdef ggml_backend_dev_t d
    if device_names:
        for name in device_names[:16]:
            d = ggml_backend_dev_by_name(name.encode())
            if d == NULL:
                raise ValueError(f"unknown device {name!r}; devices: {[x['name'] for x in list_devices()]}")
            devs[n] = d
            n += 1
    else:
        for accelerators in (True, False):
            for i in range(ggml_backend_dev_count()):
                d = ggml_backend_dev_get(i)
                t = ggml_backend_dev_type(d)
                if n < 16 and (t not in (GGML_BACKEND_DEVICE_TYPE_CPU, GGML_BACKEND_DEVICE_TYPE_ACCEL) if accelerators
                               else t == GGML_BACKEND_DEVICE_TYPE_CPU):
                    devs[n] = d
                    n += 1
            if n:
                break
    split_endpoint(endpoint)
    cdef bytes ep = endpoint.encode()
    cdef bytes cache = cache_dir.encode() if cache_dir else None
    cdef const char * ep_c = ep
    cdef const char * cache_c = NULL
    if cache is not None:
        cache_c = cache
    cdef size_t threads = n_threads
    with nogil:
        start(ep_c, cache_c, threads, n, devs)
