"""One connection from the sender's address that sends nothing: a receiver still waiting for a
sender that ended without connecting (a container that did not start) sees a cut stream and ends at
once, rather than after its minute of waiting (stream.run). argv: address, port, source address."""

import socket
import sys

if __name__ == "__main__":
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5, source_address=(sys.argv[3], 0)).close()
