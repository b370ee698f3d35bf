"""tests/testbed/delay.py's netlink messages, packed and parsed without a kernel (no root needed)."""

import struct

from tests.testbed import delay


def test_bind_command_is_a_queue_config_message_asking_for_an_ack():
    msg = delay.config_cmd(7, delay.NFQNL_CFG_CMD_BIND, seq=3)
    n, kind, flags, seq, pid = struct.unpack_from("=IHHII", msg)
    assert (n, kind, seq, pid) == (len(msg), (3 << 8) | 2, 3, 0)
    assert flags == delay.NLM_F_REQUEST | delay.NLM_F_ACK
    assert msg[16:20] == b"\x00\x00\x00\x07"  # nfgenmsg: AF_UNSPEC, version 0, queue 7 big-endian
    assert msg[20:] == struct.pack("=HH", 8, delay.NFQA_CFG_CMD) + bytes([1, 0, 0, 0])


def test_params_ask_for_metadata_only_a_long_queue_and_fail_open():
    msg = delay.config_params(9, maxlen=16384, seq=1)
    got = delay.attrs(msg, 20)
    assert got[delay.NFQA_CFG_PARAMS] == struct.pack(">IB", 0, delay.NFQNL_COPY_META)
    assert struct.unpack(">I", got[delay.NFQA_CFG_QUEUE_MAXLEN]) == (16384,)
    flags = delay.NFQA_CFG_F_FAIL_OPEN | delay.NFQA_CFG_F_GSO
    assert struct.unpack(">I", got[delay.NFQA_CFG_FLAGS]) == struct.unpack(">I", got[delay.NFQA_CFG_MASK]) == (flags,)
    assert len(msg) % 4 == 0 and struct.unpack_from("=I", msg)[0] == len(msg)


def test_a_batch_verdict_accepts_up_to_an_id():
    msg = delay.verdict_batch(5, 1234)
    (kind,) = struct.unpack_from("=H", msg, 4)
    assert kind == (3 << 8) | delay.NFQNL_MSG_VERDICT_BATCH
    assert delay.attrs(msg, 20) == {delay.NFQA_VERDICT_HDR: struct.pack(">II", delay.NF_ACCEPT, 1234)}


def _packet(pid: int, seq: int = 0) -> bytes:
    body = b"\x02\x00\x00\x07" + delay.attr(delay.NFQA_PACKET_HDR, struct.pack(">IHB", pid, 0x0800, 3))
    body += delay.attr(delay.NFQA_CFG_MASK + 10, b"\x01\x02\x03")  # another attribute, odd length
    return struct.pack("=IHHII", 16 + len(body), (3 << 8) | delay.NFQNL_MSG_PACKET, 0, seq, 0) + body


def test_packets_in_one_datagram_are_read_with_their_ids_in_order():
    buf = _packet(41) + _packet(42) + _packet(43)
    got = [(kind, delay.packet_id(payload)) for kind, _f, _s, payload in delay.messages(buf)]
    assert got == [((3 << 8) | delay.NFQNL_MSG_PACKET, i) for i in (41, 42, 43)]


def test_an_error_message_gives_its_errno_and_a_truncated_datagram_stops_the_reading():
    err = struct.pack("=IHHII", 36, delay.NLMSG_ERROR, 0, 5, 0) + struct.pack("=i", -16) + b"\0" * 16
    ((kind, _f, seq, payload),) = delay.messages(err)
    assert (kind, seq, delay.error_code(payload)) == (delay.NLMSG_ERROR, 5, -16)
    assert list(delay.messages(_packet(1)[:-4])) == []
    assert delay.packet_id(b"\x02\x00\x00\x07") is None


def test_the_rule_matches_the_interface_on_its_chain():
    assert delay._rule("enp1s0f0np0", 100)[:3] == ["OUTPUT", "-o", "enp1s0f0np0"]
    rule = delay._rule("enp1s0f0np0", 100, "INPUT")
    assert rule[:3] == ["INPUT", "-i", "enp1s0f0np0"]
    assert rule[-4:] == ["NFQUEUE", "--queue-num", "100", "--queue-bypass"]
