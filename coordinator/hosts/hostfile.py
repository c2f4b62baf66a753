"""Which agents to drive: `--hosts mac1,mac2:6000` or a hostfile in TOML or JSON; for
`coordinator benchmark`, groups too: `--hosts mac1,mac2,mac1+mac2` joins mac1 and mac2 into one
distributed group that runs each cell as one job across them (docs/distributed.md).

Hostfile formats, chosen by suffix (.toml, .json; anything else is tried as JSON, then TOML):

    [[hosts]]                      {"hosts": [{"host": "mac1", "port": 5555, "key": "..."}]}
    host = "mac1"                  [{"host": "mac1"}, {"host": "mac2:6000"}]
    port = 5555                    [{"ssh": "mac1", "ips": ["10.0.0.2"]}]   (mlx.launch's)
    key = "<40 Z85 characters>"

An mlx.launch entry's agent is reached at its first ip, else at its ssh name, while
`coordinator deploy` logs in with the ssh name (an alias of the user's ssh config); its `ips`
and `rdma` (its RDMA device towards each host, null towards itself) are what a distributed
job's ranks use (docs/distributed.md); its other mlx fields are ignored. `port` and `key` are
optional everywhere. A group is an entry of its own, naming its members by the `host` (or
`ssh`, or first ip) of other entries, so they keep their keys, ips and rdma:

    [[hosts]]                      {"group": ["mac1", "mac2"]}
    group = ["mac1", "mac2"]

Every error names the file, the entry (1-based, with its content) and what is wrong.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.distributed.group import GROUP_JOINER, group_name

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

DEFAULT_AGENT_PORT = 5555
NATIVE_FIELDS = frozenset({"host", "port", "key"})
MLX_LAUNCH_FIELDS = frozenset({"ssh", "ips", "rdma"})


class HostfileError(ValueError):
    """A host list or hostfile that cannot be used; the message names where and why."""


@dataclass(frozen=True)
class GroupEntry:
    """Hosts joined into one distributed group, in rank order (rank 0 first)."""

    members: tuple[HostEntry, ...]


@dataclass(frozen=True)
class HostEntry:
    """One agent to drive, and the CURVE server key to expect from it when known."""

    host: str
    port: int
    key: str | None = None
    ssh: str | None = None
    """The ssh name deploy logs in with, when not `host` (mlx.launch's `ssh` alias)."""
    ips: tuple[str, ...] = ()
    """mlx.launch's `ips`: the addresses a ring's peers reach this host at."""
    rdma: tuple[str | None, ...] | None = None
    """mlx.launch's `rdma`: this host's RDMA device towards each host, None towards itself;
    None when the entry gives none (no JACCL)."""

    @property
    def ssh_host(self) -> str:
        return self.ssh or self.host

    @property
    def address(self) -> str:
        """host:port, with an IPv6 host in brackets so the port stays unambiguous."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def split_address(text: str) -> tuple[str, int | None]:
    """'mac1' -> ('mac1', None); 'mac1:6000', '[::1]:6000' and bare '::1' as expected.

    Raises ValueError saying what is wrong with the text.
    """
    text = text.strip()
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket:
            raise ValueError(f"missing ']' in {text!r}")
        if rest and not rest.startswith(":"):
            raise ValueError(f"unexpected {rest!r} after ']' in {text!r}")
        port_text: str | None = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, None
        if ":" in text:
            try:
                ipaddress.IPv6Address(text)
            except ValueError:
                raise ValueError(
                    f"bad address {text!r} (write an IPv6 address with a port as [::1]:5555)"
                ) from None
    if not host or any(ch.isspace() for ch in host):
        raise ValueError(f"bad host {host!r}" if host else "missing host")
    return host, None if port_text is None else parse_port(port_text)


def parse_port(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"bad port {value!r}: expected an integer from 1 to 65535")
    return value


def _no_duplicates(entries: list[HostEntry], describe: list[str], source: str) -> None:
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        if entry.address in seen:
            first = seen[entry.address]
            raise HostfileError(
                f"{source}: {describe[index]}: duplicate host {entry.address} "
                f"(already {describe[first]})"
            )
        seen[entry.address] = index


def parse_hosts(text: str, default_port: int = DEFAULT_AGENT_PORT) -> list[HostEntry]:
    """The `--hosts` option: 'mac1,mac2:6000,[::1]:5555,127.0.0.1:5556'."""
    return _no_group(parse_hosts_and_groups(text, default_port), "--hosts")


def _no_group(entries: list[HostEntry | GroupEntry], source: str) -> list[HostEntry]:
    """The hosts of a command that drives hosts one by one: a group is refused, naming it."""
    for entry in entries:
        if isinstance(entry, GroupEntry):
            name = group_name([member.address for member in entry.members])
            raise HostfileError(
                f"{source}: the group {name} ({GROUP_JOINER} joins hosts) runs only in "
                "`coordinator benchmark`"
            )
    return entries  # type: ignore[return-value]


def parse_hosts_and_groups(
    text: str, default_port: int = DEFAULT_AGENT_PORT
) -> list[HostEntry | GroupEntry]:
    """`coordinator benchmark`'s --hosts: hosts and groups, 'mac1,mac2,mac1+mac2'."""
    items = text.split(",")
    entries: list[HostEntry | GroupEntry] = []
    for index, item in enumerate(items, start=1):
        where = f"--hosts: item {index} {item.strip()!r}"
        parts = item.split(GROUP_JOINER)
        if len(parts) > 1 and not all(part.strip() for part in parts):
            raise HostfileError(f"{where}: a group joins two or more hosts with {GROUP_JOINER}")
        try:
            members = [split_address(part) for part in parts]
        except ValueError as exc:
            raise HostfileError(f"{where}: {exc}") from None
        hosts = [HostEntry(host, default_port if port is None else port) for host, port in members]
        entries.append(hosts[0] if len(hosts) == 1 else group_of(hosts, where))
    singles = [entry for entry in entries if isinstance(entry, HostEntry)]
    described = [
        f"item {i} {item.strip()!r}"
        for i, (item, entry) in enumerate(zip(items, entries, strict=True), start=1)
        if isinstance(entry, HostEntry)
    ]
    _no_duplicates(singles, described, "--hosts")
    _no_duplicate_groups(entries, "--hosts")
    return entries


def group_of(members: list[HostEntry], where: str) -> GroupEntry:
    """Members joined into a group; HostfileError for one listed twice."""
    seen: set[str] = set()
    for member in members:
        if member.address in seen:
            raise HostfileError(f"{where}: a group lists {member.address} twice")
        seen.add(member.address)
    return GroupEntry(tuple(members))


def _no_duplicate_groups(entries: list[HostEntry | GroupEntry], source: str) -> None:
    groups = [entry for entry in entries if isinstance(entry, GroupEntry)]
    names = [group_name([m.address for m in group.members]) for group in groups]
    for name in names:
        if names.count(name) > 1:
            raise HostfileError(f"{source}: the group {name} is listed twice")


def _load(path: Path, text: str) -> Any:
    """The hostfile's data, by suffix; an unknown suffix is tried as JSON, then TOML."""
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return tomllib.loads(text)
    if suffix == ".json":
        return json.loads(text)
    try:
        return json.loads(text)
    except json.JSONDecodeError as json_error:
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as toml_error:
            raise ValueError(f"neither JSON ({json_error}) nor TOML ({toml_error})") from None


def _entry(raw: Any, default_port: int) -> HostEntry:
    """One hostfile entry, native or mlx.launch's; ValueError says what is wrong with it."""
    if not isinstance(raw, dict):
        raise ValueError("an entry must be a table/object")
    ssh, ips, rdma = None, [], None
    if MLX_LAUNCH_FIELDS & raw.keys() and "host" not in raw:
        ips = raw.get("ips") or []
        if not isinstance(ips, list) or not all(isinstance(ip, str) for ip in ips):
            raise ValueError("ips must be a list of addresses")
        rdma = raw.get("rdma")
        if rdma is not None and not (
            isinstance(rdma, list) and all(d is None or isinstance(d, str) for d in rdma)
        ):
            raise ValueError("rdma must be a list of device names or null, one per host")
        ssh = raw.get("ssh")
        if ssh is not None and not isinstance(ssh, str):
            raise ValueError("ssh must be a host name")
        ssh = ssh.strip() if ssh else None
        address = ips[0] if ips else ssh
    else:
        unknown = sorted(set(raw) - NATIVE_FIELDS)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}; expected host, port, key")
        address = raw.get("host")
    if address is None or (isinstance(address, str) and not address.strip()):
        raise ValueError("missing host")
    if not isinstance(address, str):
        raise ValueError(f"host is {type(address).__name__} {address!r}, not a host name")
    host, port = split_address(address)
    if "port" in raw:
        if port is not None:
            raise ValueError(f"port given twice: in {address!r} and as port")
        port = parse_port(raw["port"])
    from shared.io.keys import check_key  # here: parsing --hosts alone needs no ZeroMQ

    key = check_key(raw["key"]) if raw.get("key") is not None else None
    devices = None if rdma is None else tuple(rdma)
    return HostEntry(host, default_port if port is None else port, key, ssh, tuple(ips), devices)


def parse_hostfile(path: Path, default_port: int = DEFAULT_AGENT_PORT) -> list[HostEntry]:
    """Every host of a TOML or JSON hostfile (see the module doc), validated; a group entry
    is refused (groups run only in `coordinator benchmark`)."""
    return _no_group(parse_hostfile_and_groups(path, default_port), str(path))


def parse_hostfile_and_groups(
    path: Path, default_port: int = DEFAULT_AGENT_PORT
) -> list[HostEntry | GroupEntry]:
    """Every host and group of a TOML or JSON hostfile (see the module doc), validated: a
    group's members name host entries of the same file."""
    try:
        data = _load(path, path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise HostfileError(f"{path}: cannot read: {exc}") from None
    except ValueError as exc:  # JSON and TOML decode errors included
        raise HostfileError(f"{path}: not a valid hostfile: {exc}") from None
    raw_entries = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(raw_entries, list):
        raise HostfileError(
            f"{path}: expected a list of hosts or a 'hosts' list ([[hosts]] in TOML)"
        )
    if not raw_entries:
        raise HostfileError(f"{path}: no hosts")
    described = [
        f"entry {i} {json.dumps(raw, default=str)}" for i, raw in enumerate(raw_entries, start=1)
    ]
    hosts: list[HostEntry] = []
    host_described: list[str] = []
    for raw, describe in zip(raw_entries, described, strict=True):
        if isinstance(raw, dict) and "group" in raw:
            continue
        try:
            hosts.append(_entry(raw, default_port))
        except ValueError as exc:
            raise HostfileError(f"{path}: {describe}: {exc}") from None
        host_described.append(describe)
    _no_duplicates(hosts, host_described, str(path))
    by_name = {}
    for host in hosts:
        for name in (host.host, host.ssh, host.address, *host.ips[:1]):
            if name:
                by_name.setdefault(name, host)
    entries: list[HostEntry | GroupEntry] = []
    singles = iter(hosts)
    for raw, describe in zip(raw_entries, described, strict=True):
        if not (isinstance(raw, dict) and "group" in raw):
            entries.append(next(singles))
            continue
        entries.append(_group_entry(raw, by_name, f"{path}: {describe}"))
    _no_duplicate_groups(entries, str(path))
    return entries


def _group_entry(raw: dict[str, Any], by_name: dict[str, HostEntry], where: str) -> GroupEntry:
    """A hostfile's group entry, its members found among the file's hosts."""
    names = raw["group"]
    if set(raw) != {"group"}:
        raise HostfileError(f"{where}: a group entry has only `group`, a list of its members")
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise HostfileError(f"{where}: group must be a list of host names")
    if len(names) < 2:
        raise HostfileError(f"{where}: a group needs at least two members")
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise HostfileError(f"{where}: {', '.join(unknown)}: no host entry of that name")
    return group_of([by_name[name] for name in names], where)
