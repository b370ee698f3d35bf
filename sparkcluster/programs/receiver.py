"""The one-shot receiver: listens on argv[1] (the node's control-link address), accepts one
connection from argv[2] (the sender's address) only, and writes the framed stream (framing) to its
sink: `docker load` (the image), or "stdout" (a byte pipe: the weights' tar of files). An argument
"next=ADDR,PORT,SRC" makes it a relay, forwarding every frame to the next node's receiver as it
arrives. The stream is framed so the receiver can tell a finished archive from a connection that
broke: it then kills docker load instead of closing its input, since a tar cut at an entry boundary
can read as a short but valid archive. Exit status: STREAM_CUT (75) when the connection ended before
the end frame, RELAY_FAILED (76) when the next hop could not be reached or stopped taking data.
"""

import socket
import struct
import subprocess
import sys

from sparkcluster.programs.pipes import wide_pipe

STREAM_CUT = 75
RELAY_FAILED = 76


def main(argv):
    bind, peer = argv[1], argv[2]
    # the sink: docker load (the image), or "stdout" (a byte pipe: the weights' tar of files);
    # "next=ADDR,PORT,SRC": a relay, forwarding every frame to the next node's receiver as it arrives
    to_stdout = "stdout" in argv[3:]
    hop = [a[5:].split(",") for a in argv[3:] if a.startswith("next=")]
    s = socket.socket()
    s.bind((bind, 0))
    s.listen(1)
    s.settimeout(60)
    nxt, relay_err = None, ""
    if hop:
        dst, port, src = hop[0][0], int(hop[0][1]), hop[0][2]
        try:
            nxt = socket.create_connection((dst, port), timeout=30, source_address=(src, 0))
            nxt.settimeout(600)
        except OSError as e:
            print(f"relay: cannot reach the next hop {dst}:{port} from {src}: {e}", file=sys.stderr, flush=True)
            sys.exit(RELAY_FAILED)
    print(f"@@port {s.getsockname()[1]}", file=sys.stderr, flush=True)
    while True:
        c, addr = s.accept()
        if addr[0] == peer:
            break
        c.close()
    s.close()
    c.settimeout(600)
    f = c.makefile("rb", buffering=1 << 20)
    load = None if to_stdout else subprocess.Popen(["docker", "load"], stdin=subprocess.PIPE)
    sink = sys.stdout.buffer if to_stdout else load.stdin
    wide_pipe(sink)
    sink_err = ""
    done = False
    try:
        while True:
            h = f.read(4)
            if len(h) < 4:
                break
            n = struct.unpack(">I", h)[0]
            if n == 0:
                done = True
                break
            b = f.read(n)
            if len(b) < n:
                break
            # forwarded first, so the next node receives while this one writes; a next hop that stops
            # taking data ends the relay, never this node's own copy
            if nxt is not None:
                try:
                    nxt.sendall(h + b)
                except OSError as e:
                    relay_err = f"relay: the next hop {dst}:{port} stopped taking data: {e}"
                    print(relay_err, file=sys.stderr, flush=True)
                    nxt.close()
                    nxt = None
            if sink is not None:
                try:
                    sink.write(b)
                except OSError as e:
                    sink_err = f"receive: the sink stopped taking data: {e}"
                    print(sink_err, file=sys.stderr, flush=True)
                    sink = None
                    if nxt is None:
                        break  # nothing left to feed
    except (TimeoutError, OSError) as e:
        print(f"receive: {e}", file=sys.stderr)
    if not done:
        # closed without the end frame: the next node sees a cut stream and loads nothing either
        if nxt is not None:
            nxt.close()
        if load:
            load.kill()
            load.wait()
            print(
                "receive: the stream ended before the archive did; docker load stopped, nothing loaded", file=sys.stderr
            )
        else:
            sys.stdout.flush()
            print("receive: the stream ended before the sender finished", file=sys.stderr)
        sys.exit(STREAM_CUT)
    if nxt is not None:
        try:
            nxt.sendall(struct.pack(">I", 0))
            nxt.shutdown(socket.SHUT_WR)
        except OSError as e:
            relay_err = f"relay: the next hop {dst}:{port} did not take the end of the stream: {e}"
            print(relay_err, file=sys.stderr, flush=True)
            nxt = None
    rc = 0
    if sink is not None:
        try:
            sink.close()
        except OSError as e:
            sink_err = sink_err or f"receive: the sink stopped taking data: {e}"
    if load:
        rc = load.wait()
    if sink_err and not rc:
        rc = 1
    if nxt is not None:
        try:
            nxt.recv(1)  # the next node closes when it is done (its own load, and its next hop's)
        except OSError:
            pass
    if relay_err and not rc:
        print(
            "relay: this node's own copy is complete; the nodes after it did not get theirs",
            file=sys.stderr,
            flush=True,
        )
        rc = RELAY_FAILED
    sys.exit(rc)


if __name__ == "__main__":
    main(sys.argv)
