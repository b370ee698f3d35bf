# TEST DOUBLE of a service image's own entrypoint (a server that reads its key from a file named by a
# `*_FILE` variable, its voices from a mounted folder), for the testbed's keyed stand-in
# (tests/testbed/images/Dockerfile.keyed-standin): busybox's sh, no python3 anywhere in the image.
#   $1: the port (the profile's args, appended to this entrypoint as Docker appends a command)
#   API_KEY_FILE: the file holding the key the clients must send as `Authorization: Bearer`
#   VOICES: the mounted folder; its `default.wav` is what /v1/audio/speech answers
# It refuses to start without a readable, non-empty key file or without the folder, as a server
# whose secret did not arrive should. The fault file UNHEALTHY (the supervisor's test makes it) is
# removed here: only a restart brings /health back.
set -eu
port="${1:-8080}"
case "$port" in *[!0-9]*|'') echo "keyed stand-in: not a port: $port" >&2; exit 2 ;; esac
if [ -z "${API_KEY_FILE:-}" ] || [ ! -r "$API_KEY_FILE" ] || [ ! -s "$API_KEY_FILE" ]; then
    echo "keyed stand-in: no key: API_KEY_FILE must name a readable, non-empty file" >&2
    exit 2
fi
export VOICES="${VOICES:-/voices}"
if [ ! -r "$VOICES/default.wav" ]; then
    echo "keyed stand-in: no voice: $VOICES/default.wav (mount the voices folder)" >&2
    exit 2
fi
rm -f /tmp/keyed-standin-unhealthy
echo "keyed stand-in: serving on :$port, voices from $VOICES" >&2
exec busybox nc -ll -p "$port" -e /opt/keyed-standin/handler.sh
