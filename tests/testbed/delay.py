"""A fixed egress delay through NFQUEUE: the testbed's stand-in for `tc qdisc ... netem delay`.

Why: the testbed delays what one host sends on one interface (a slow round trip between the ranks),
which is what sch_netem's fixed delay does. This machine's kernel has no sch_netem (nor fq, etf or
prio: only tbf and htb), and a token bucket (tbf) limits a rate, it does not add a fixed time to every
packet, so the scenario it stood in for went wrong. The kernel does have NFQUEUE
(CONFIG_NETFILTER_NETLINK_QUEUE, CONFIG_NETFILTER_XT_TARGET_NFQUEUE), so:

- an iptables rule in the host's network namespace (`-A OUTPUT -o IFNAME -j NFQUEUE --queue-num N
  --queue-bypass`) hands every packet the host sends on IFNAME to queue N; --queue-bypass lets
  packets pass while no reader is bound;
- this module's reader (standard library only: a NETLINK_NETFILTER socket and struct) binds queue N
  with copy mode META (the packet's id and metadata, never its payload), holds each id for the delay
  and then accepts it. Verdicts are given in arrival order and in batches (NFQNL_MSG_VERDICT_BATCH
  accepts every queued packet up to an id), so packets leave in the order they came. The queue is long
  (--maxlen) and fail-open (NFQA_CFG_F_FAIL_OPEN: a full queue or socket buffer lets the packet pass
  instead of dropping it); a reader that dies unbinds, and then --queue-bypass lets traffic pass;
- SIGTERM (or SIGINT) flushes: everything held is accepted at once, then the queue is unbound. stop()
  sends SIGUSR1 first (no more delay) and only then removes the rule, so no packet overtakes another.

Unlike netem, the delay is taken in user space: a few hundred microseconds of jitter on top of the
delay, and a few thousand packets a second is what it is meant for (TCP's segmentation offload keeps
a bulk transfer to far fewer packets: GSO packets are queued whole, NFQA_CFG_F_GSO).

Run it as `python -m tests.testbed.delay --queue N --delay-ms D` (or this file by its path: it
imports nothing from the project); start()/stop() install the rule and run the reader in a namespace
given as the argv prefix that enters it (Testbed.nsenter_argv(host), or `ip netns exec NAME`).
"""

from __future__ import annotations

import argparse
import collections
import errno
import os
import select
import shlex
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQNL_MSG_VERDICT_BATCH = 3

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4

# NFQA_CFG_* attributes of a config message, and the command in NFQA_CFG_CMD
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN = 0x1
NFQA_CFG_F_GSO = 0x4

# NFQA_* attributes of a packet or verdict message
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NF_ACCEPT = 1

SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5

NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid (host order)
NFGENMSG = struct.Struct("=BBH")  # family, version, res_id (res_id big-endian: packed apart)
NLATTR = struct.Struct("=HH")  # len, type
NLA_TYPE_MASK = 0x3FFF

RULE_COMMENT = "sctb-delay"


def _align4(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    n = NLATTR.size + len(payload)
    return (NLATTR.pack(n, kind) + payload).ljust(_align4(n), b"\0")


def nfq_message(msg: int, queue: int, attrs: bytes, seq: int = 0, flags: int = NLM_F_REQUEST, family: int = 0):
    """A nfnetlink message to the queue subsystem: nlmsghdr, nfgenmsg (res_id = the queue), attributes."""
    body = NFGENMSG.pack(family, 0, 0)[:2] + struct.pack(">H", queue) + attrs
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + body


def config_cmd(queue: int, command: int, seq: int = 0) -> bytes:
    """NFQA_CFG_CMD (struct nfqnl_msg_config_cmd: u8 command, u8 pad, be16 pf)."""
    return nfq_message(
        NFQNL_MSG_CONFIG,
        queue,
        attr(NFQA_CFG_CMD, struct.pack(">BBH", command, 0, 0)),
        seq,
        flags=NLM_F_REQUEST | NLM_F_ACK,
    )


def config_params(queue: int, maxlen: int, copy_range: int = 0, seq: int = 0, flags: int | None = None) -> bytes:
    """Copy mode META (struct nfqnl_msg_config_params: be32 copy_range, u8 copy_mode), the queue's
    length, and the flags (fail-open, GSO) with their mask."""
    flags = NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO if flags is None else flags
    attrs = (
        attr(NFQA_CFG_PARAMS, struct.pack(">IB", copy_range, NFQNL_COPY_META))
        + attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", maxlen))
        + attr(NFQA_CFG_FLAGS, struct.pack(">I", flags))
        + attr(NFQA_CFG_MASK, struct.pack(">I", flags))
    )
    return nfq_message(NFQNL_MSG_CONFIG, queue, attrs, seq, flags=NLM_F_REQUEST | NLM_F_ACK)


def verdict_batch(queue: int, upto_id: int, verdict: int = NF_ACCEPT, seq: int = 0) -> bytes:
    """NFQNL_MSG_VERDICT_BATCH: `verdict` for every packet queued with an id up to `upto_id`."""
    return nfq_message(
        NFQNL_MSG_VERDICT_BATCH, queue, attr(NFQA_VERDICT_HDR, struct.pack(">II", verdict, upto_id)), seq
    )


def messages(buf: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, flags, seq, payload) of each netlink message in a datagram."""
    off = 0
    while off + NLMSGHDR.size <= len(buf):
        n, kind, flags, seq, _pid = NLMSGHDR.unpack_from(buf, off)
        if n < NLMSGHDR.size or off + n > len(buf):
            break
        yield kind, flags, seq, buf[off + NLMSGHDR.size : off + n]
        off += _align4(n)


def attrs(buf: bytes, off: int = 0) -> dict[int, bytes]:
    """A message's attributes from `off` on, by type (nested/byte-order flags masked off)."""
    out = {}
    while off + NLATTR.size <= len(buf):
        n, kind = NLATTR.unpack_from(buf, off)
        if n < NLATTR.size:
            break
        out[kind & NLA_TYPE_MASK] = buf[off + NLATTR.size : off + n]
        off += _align4(n)
    return out


def packet_id(payload: bytes) -> int | None:
    """The packet id of a NFQNL_MSG_PACKET's payload (after its nfgenmsg): NFQA_PACKET_HDR's be32."""
    hdr = attrs(payload, NFGENMSG.size).get(NFQA_PACKET_HDR)
    return struct.unpack_from(">I", hdr)[0] if hdr and len(hdr) >= 4 else None


def error_code(payload: bytes) -> int:
    """A NLMSG_ERROR's error (0 is an ACK, else -errno)."""
    return struct.unpack_from("=i", payload)[0]


class Reader:
    """Bound to one queue: holds each packet's id for `delay` seconds, then accepts, in order."""

    def __init__(self, queue: int, delay_ms: float, maxlen: int = 16384):
        self.queue, self.delay, self.maxlen = queue, delay_ms / 1000.0, maxlen
        self.held: collections.deque[tuple[float, int]] = collections.deque()  # (due, id), arrival order
        self.stopping = False
        self.passing = False  # SIGUSR1: no more delay (everything held and new accepted at once, in order)
        self.seq = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        for opt in (33, socket.SO_RCVBUF):  # SO_RCVBUFFORCE (root), else what rmem_max allows
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
                break
            except OSError:
                continue
        try:
            self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        except OSError:
            pass
        self.sock.bind((0, 0))

    def _request(self, msg_fn: Callable[[int], bytes]) -> None:
        self.seq += 1
        seq = self.seq
        self.sock.send(msg_fn(seq))
        while True:
            buf = self.sock.recv(1 << 16)
            for kind, _flags, got_seq, payload in messages(buf):
                if kind == NLMSG_ERROR and got_seq == seq:
                    err = error_code(payload)
                    if err:
                        raise OSError(-err, f"nfqueue config (queue {self.queue}): {os.strerror(-err)}")
                    return
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:  # a packet already: keep it
                    self._arrived(payload)

    def bind(self) -> None:
        self._request(lambda s: config_cmd(self.queue, NFQNL_CFG_CMD_BIND, s))
        try:
            self._request(lambda s: config_params(self.queue, self.maxlen, seq=s))
        except OSError:  # a kernel without some flag: fail-open alone, then none
            try:
                self._request(lambda s: config_params(self.queue, self.maxlen, seq=s, flags=NFQA_CFG_F_FAIL_OPEN))
            except OSError:
                self._request(lambda s: config_params(self.queue, self.maxlen, seq=s, flags=0))

    def _arrived(self, payload: bytes) -> None:
        pid = packet_id(payload)
        if pid is not None:
            self.held.append((time.monotonic() + self.delay, pid))

    def _drain(self) -> None:
        """Every message the socket holds now, without waiting."""
        while True:
            try:
                buf = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno == errno.ENOBUFS:  # notifications lost (fail-open passed those packets)
                    continue
                raise
            for kind, _flags, _seq, payload in messages(buf):
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    self._arrived(payload)

    def _release(self, now: float | None) -> None:
        """Accept every held packet due by `now` (all of them when None), in one batch verdict."""
        last = None
        while self.held and (now is None or self.held[0][0] <= now):
            last = self.held.popleft()[1]
        if last is not None:
            self.sock.send(verdict_batch(self.queue, last))

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        while not self.stopping:
            now = time.monotonic()
            self._release(None if self.passing else now)
            wait = max(0.0, self.held[0][0] - now) if self.held else 0.1  # a signal wakes it by then
            try:
                ready = poller.poll(wait * 1000.0)
            except InterruptedError:
                continue
            if ready:
                self._drain()
        self.flush()

    def flush(self) -> None:
        """Accept everything held and queued now, then unbind (a closed socket would drop what is left)."""
        self._drain()
        self._release(None)
        self._drain()
        self._release(None)
        try:
            self._request(lambda s: config_cmd(self.queue, NFQNL_CFG_CMD_UNBIND, s))
        except OSError:
            pass
        self._release(None)
        self.sock.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queue", type=int, required=True, help="the NFQUEUE number (--queue-num of the rule)")
    ap.add_argument("--delay-ms", type=float, required=True, help="how long each packet is held")
    ap.add_argument("--maxlen", type=int, default=16384, help="the kernel queue's length (then fail-open)")
    a = ap.parse_args(argv)
    r = Reader(a.queue, a.delay_ms, a.maxlen)

    def stop(*_):
        r.stopping = True

    def pass_now(*_):
        r.passing = True

    signal.signal(signal.SIGUSR1, pass_now)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    r.bind()
    print(f"bound {os.getpid()}", flush=True)  # start() waits for this line
    r.run()
    return 0


# ---------------------------------------------------------------- the rule and the reader in a namespace
def _rule(ifname: str, queue: int, chain: str = "OUTPUT") -> list[str]:
    """The NFQUEUE rule: `-o IFNAME` on OUTPUT and FORWARD (what leaves by it), `-i` on INPUT."""
    return [
        chain,
        "-i" if chain == "INPUT" else "-o",
        ifname,
        "-m",
        "comment",
        "--comment",
        f"{RULE_COMMENT} q{queue}",
        "-j",
        "NFQUEUE",
        "--queue-num",
        str(queue),
        "--queue-bypass",
    ]


def start(
    ns_argv: list[str],
    ifname: str,
    delay_ms: float,
    queue: int = 7,
    forward: bool = False,
    chains: tuple[str, ...] | None = None,
    log_path: str | os.PathLike | None = None,
    python: str = sys.executable,
) -> subprocess.Popen:
    """Run the reader in the namespace `ns_argv` enters, then install the rule(s) queueing what it sends
    on `ifname` (OUTPUT; FORWARD too when `forward`, for what it routes). The reader runs in a session of
    its own: stop() ends it by its process group. Raises RuntimeError when either part fails."""
    logf = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        p = subprocess.Popen(
            ns_argv + [python, os.path.abspath(__file__), "--queue", str(queue), "--delay-ms", str(delay_ms)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=logf,
            start_new_session=True,
            cwd="/",
        )
    finally:
        if log_path:
            logf.close()
    line = p.stdout.readline().decode(errors="replace").strip()
    if not line.startswith("bound"):
        end_reader(p.pid)
        p.wait()
        raise RuntimeError(f"the nfqueue delay reader did not bind queue {queue} (rc {p.poll()}; see {log_path})")
    for chain in chains or (("OUTPUT", "FORWARD") if forward else ("OUTPUT",)):
        got = subprocess.run(
            ns_argv + ["iptables", "-w", "-I"] + _rule(ifname, queue, chain), capture_output=True, text=True
        )
        if got.returncode != 0:
            stop(ns_argv, ifname, p.pid)
            raise RuntimeError(f"iptables NFQUEUE rule on {ifname}: {got.stderr.strip()}")
    return p


def remove_rules(ns_argv: list[str], ifname: str | None = None) -> int:
    """Delete this module's rules (by their comment) from OUTPUT and FORWARD, those of `ifname` or all."""
    n = 0
    for chain in ("OUTPUT", "FORWARD", "INPUT"):
        got = subprocess.run(ns_argv + ["iptables", "-w", "-S", chain], capture_output=True, text=True)
        for line in got.stdout.splitlines():
            words = shlex.split(line)
            if not words or words[0] != "-A" or RULE_COMMENT not in " ".join(words):
                continue
            flag = "-i" if "-i" in words else "-o"
            if ifname and not (flag in words and words[words.index(flag) + 1] == ifname):
                continue
            if subprocess.run(ns_argv + ["iptables", "-w", "-D"] + words[1:], capture_output=True).returncode == 0:
                n += 1
    return n


def pass_through(pgid: int) -> None:
    """SIGUSR1 to the reader: accept what it holds and what comes from now on at once. Before the rule
    goes (stop()), so that what it held leaves ahead of what comes next: order is kept."""
    try:
        os.killpg(pgid, signal.SIGUSR1)
    except ProcessLookupError:
        return
    time.sleep(0.05)


def end_reader(pgid: int, timeout: float = 5.0) -> None:
    """SIGTERM the reader's process group (it flushes), SIGKILL if it is still there after `timeout`."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    t = time.monotonic() + timeout
    while time.monotonic() < t:
        try:
            os.waitpid(pgid, os.WNOHANG)  # our child (the leader): reap it, else it looks alive
        except ChildProcessError:
            pass
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop(ns_argv: list[str], ifname: str | None, pgid: int | None) -> None:
    """Undo start(): the rule first (new packets no longer queue), then the reader, which accepts what it
    holds before it exits."""
    if pgid:
        pass_through(pgid)
    remove_rules(ns_argv, ifname)
    if pgid:
        end_reader(pgid)


if __name__ == "__main__":
    sys.exit(main())
