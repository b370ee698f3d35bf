#!/usr/bin/busybox sh
# TEST DOUBLE: one HTTP/1.0 exchange on stdin/stdout (busybox nc -e runs it per connection), for the
# keyed stand-in (entrypoint.sh): `GET /health` (503 while the fault file exists), `POST
# /v1/audio/speech` with the key from $API_KEY_FILE as a bearer token (401 without it), answered with
# the mounted voice's WAV; anything else 404. Headers are read line by line; the body is drained.
cr=$(printf '\r')
read -r method path _ || exit 0
auth="" len=0
while read -r line; do
    line="${line%"$cr"}"
    [ -z "$line" ] && break
    name=$(printf '%s' "${line%%:*}" | tr 'A-Z' 'a-z')
    value="${line#*:}"
    value="${value# }"
    case "$name" in
        authorization) auth="$value" ;;
        content-length) len="$value" ;;
    esac
done
case "$len" in *[!0-9]*|'') len=0 ;; esac
[ "$len" -gt 0 ] && head -c "$len" > /dev/null

answer() {  # status, content type, body file
    size=$(wc -c < "$3")
    printf 'HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %s\r\nConnection: close\r\n\r\n' "$1" "$2" "$size"
    cat "$3"
}
say() {  # status, text
    printf '%s\n' "$2" > /tmp/keyed-standin-answer.$$
    answer "$1" "text/plain" /tmp/keyed-standin-answer.$$
    rm -f /tmp/keyed-standin-answer.$$
}

case "$method $path" in
    "GET /health")
        if [ -e /tmp/keyed-standin-unhealthy ]; then say "503 Service Unavailable" "unhealthy"; else say "200 OK" "ok"; fi ;;
    "POST /v1/audio/speech")
        if [ "$auth" = "Bearer $(cat "$API_KEY_FILE")" ]; then
            answer "200 OK" "audio/wav" "$VOICES/default.wav"
        else
            say "401 Unauthorized" "a bearer key is required"
        fi ;;
    *)
        say "404 Not Found" "no such route: $method $path" ;;
esac
