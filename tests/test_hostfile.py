"""--hosts lists and hostfiles (TOML, JSON, mlx.launch's JSON), and every error they can raise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.hosts.hostfile import (
    DEFAULT_AGENT_PORT,
    HostEntry,
    HostfileError,
    parse_hostfile,
    parse_hosts,
)
from shared.io.keys import new_keypair

KEY = new_keypair()[0]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_parse_hosts_all_address_forms() -> None:
    entries = parse_hosts("mac1, mac2:6000,[::1]:5555,127.0.0.1:5556,fe80::1,[::2]")
    assert entries == [
        HostEntry("mac1", 5555, None),
        HostEntry("mac2", 6000, None),
        HostEntry("::1", 5555, None),
        HostEntry("127.0.0.1", 5556, None),
        HostEntry("fe80::1", 5555, None),
        HostEntry("::2", 5555, None),
    ]
    assert [e.address for e in entries] == [
        "mac1:5555",
        "mac2:6000",
        "[::1]:5555",
        "127.0.0.1:5556",
        "[fe80::1]:5555",
        "[::2]:5555",
    ]
    assert DEFAULT_AGENT_PORT == 5555


def test_parse_hosts_default_port() -> None:
    assert parse_hosts("mac1,mac2:1", default_port=7000) == [
        HostEntry("mac1", 7000, None),
        HostEntry("mac2", 1, None),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mac1,,mac2", "--hosts: item 2 '': missing host"),
        ("", "--hosts: item 1 '': missing host"),
        ("mac1:0", "item 1 'mac1:0': bad port 0"),
        ("mac1:65536", "bad port 65536"),
        ("mac1:http", "bad port 'http'"),
        ("mac1:", "bad port ''"),
        ("a:b:c", "bad address 'a:b:c' (write an IPv6 address with a port as [::1]:5555)"),
        ("[::1", "missing ']'"),
        ("[::1]5555", "unexpected '5555' after ']'"),
        ("mac 1", "bad host 'mac 1'"),
        (
            "mac1,mac2,mac1:5555",
            "item 3 'mac1:5555': duplicate host mac1:5555 (already item 1 'mac1')",
        ),
    ],
)
def test_parse_hosts_errors(text: str, message: str) -> None:
    with pytest.raises(HostfileError) as caught:
        parse_hosts(text)
    assert message in str(caught.value)
    assert str(caught.value).startswith("--hosts: ")


def test_toml_hostfile(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "fleet.toml",
        f"""
[[hosts]]
host = "mac1"
port = 6000
key = "{KEY}"

[[hosts]]
host = "mac2"

[[hosts]]
host = "[::1]:5556"
""",
    )
    assert parse_hostfile(path) == [
        HostEntry("mac1", 6000, KEY),
        HostEntry("mac2", 5555, None),
        HostEntry("::1", 5556, None),
    ]


JSON_HOSTS = [{"host": "10.0.0.2", "port": 5555, "key": KEY}, {"host": "mac2:6001"}]
JSON_ENTRIES = [HostEntry("10.0.0.2", 5555, KEY), HostEntry("mac2", 6001, None)]


def test_json_object_with_a_hosts_list(tmp_path: Path) -> None:
    path = write(tmp_path, "a.json", json.dumps({"hosts": JSON_HOSTS}))
    assert parse_hostfile(path) == JSON_ENTRIES


def test_json_list_of_hosts(tmp_path: Path) -> None:
    assert parse_hostfile(write(tmp_path, "b.json", json.dumps(JSON_HOSTS))) == JSON_ENTRIES


def test_mlx_launch_hostfile(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "hosts.json",
        json.dumps(
            [
                {"ssh": "mac1", "ips": ["10.0.0.2", "10.0.1.2"], "rdma": [None, "rdma_en5"]},
                {"ssh": "mac2", "ips": []},
                {"ssh": "mac3"},
                {"ssh": "mac4", "port": 6000, "key": KEY},
            ]
        ),
    )
    entries = parse_hostfile(path)
    assert entries == [
        HostEntry("10.0.0.2", 5555, None, "mac1", ("10.0.0.2", "10.0.1.2"), (None, "rdma_en5")),
        HostEntry("mac2", 5555, None, "mac2"),
        HostEntry("mac3", 5555, None, "mac3"),
        HostEntry("mac4", 6000, KEY, "mac4"),
    ]
    # The agent is driven at its first ip; deploy logs in with the ssh config's alias.
    assert [(e.address, e.ssh_host) for e in entries[:2]] == [
        ("10.0.0.2:5555", "mac1"),
        ("mac2:5555", "mac2"),
    ]
    assert HostEntry("mac5", 5555).ssh_host == "mac5"


@pytest.mark.parametrize("rdma", ["rdma_en5", [None, 5], {"a": 1}])
def test_mlx_launch_rdma_must_be_a_device_per_host(tmp_path: Path, rdma: object) -> None:
    path = write(tmp_path, "hosts.json", json.dumps([{"ssh": "mac1", "ips": ["1"], "rdma": rdma}]))
    with pytest.raises(HostfileError) as caught:
        parse_hostfile(path)
    assert "rdma must be a list of device names or null, one per host" in str(caught.value)


def test_suffixless_files_are_sniffed(tmp_path: Path) -> None:
    assert parse_hostfile(write(tmp_path, "hosts", '[{"ssh": "mac1"}]')) == [
        HostEntry("mac1", 5555, None, "mac1")
    ]
    assert parse_hostfile(write(tmp_path, "fleet", '[[hosts]]\nhost = "mac2"\n')) == [
        HostEntry("mac2", 5555, None)
    ]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "h.toml",
            '[[hosts]]\nhost = "mac1"\nport = 0\n',
            'entry 1 {"host": "mac1", "port": 0}: bad port 0',
        ),
        (
            "h.json",
            '[{"host": "mac1", "port": "x"}]',
            'entry 1 {"host": "mac1", "port": "x"}: bad port \'x\'',
        ),
        ("h.json", '[{"host": "mac1", "port": true}]', "bad port True"),
        ("h.json", '[{"host": "mac1"}, {"port": 5555}]', 'entry 2 {"port": 5555}: missing host'),
        ("h.json", '[{"host": ""}]', 'entry 1 {"host": ""}: missing host'),
        ("h.json", '[{"ssh": "", "ips": []}]', "missing host"),
        ("h.json", '[{"ssh": "mac1", "ips": "10.0.0.2"}]', "ips must be a list of addresses"),
        ("h.json", '[{"ssh": 7, "ips": ["10.0.0.2"]}]', "ssh must be a host name"),
        (
            "h.toml",
            '[[hosts]]\nhost = "mac1"\n[[hosts]]\nhost = "mac2"\n[[hosts]]\nhost = "mac1"\n',
            'entry 3 {"host": "mac1"}: duplicate host mac1:5555 (already entry 1 {"host": "mac1"})',
        ),
        (
            "h.json",
            '[{"ssh": "a", "ips": ["10.0.0.2"]}, {"host": "10.0.0.2:5555"}]',
            'entry 2 {"host": "10.0.0.2:5555"}: duplicate host 10.0.0.2:5555',
        ),
        (
            "h.json",
            '[{"host": "mac1", "key": "short"}]',
            "bad key length (5 characters): a CURVE public key is 40 Z85 characters",
        ),
        ("h.json", '[{"host": "mac1", "key": 12}]', "bad key length (int)"),
        ("h.json", json.dumps([{"host": "mac1", "key": "~" * 40}]), "not Z85 text"),
        ("h.json", json.dumps([{"host": "mac1", "key": "#" * 40}]), "not Z85 text"),
        (
            "h.json",
            '[{"host": "mac1", "prot": 5555}]',
            "unknown field(s) prot; expected host, port, key",
        ),
        ("h.json", '[{"host": "mac1:6000", "port": 6000}]', "port given twice"),
        ("h.json", '["mac1"]', 'entry 1 "mac1": an entry must be a table/object'),
        ("h.json", "[]", "no hosts"),
        ("h.toml", "", "expected a list of hosts or a 'hosts' list"),
        ("h.json", '{"host": "mac1"}', "expected a list of hosts"),
        ("h.json", '[{"host": "mac1",}]', "not a valid hostfile"),
        ("h.toml", "[[hosts]\n", "not a valid hostfile"),
        ("h", "{{{", "neither JSON"),
    ],
)
def test_hostfile_errors(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(HostfileError) as caught:
        parse_hostfile(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(HostfileError, match="cannot read"):
        parse_hostfile(tmp_path / "nope.toml")
