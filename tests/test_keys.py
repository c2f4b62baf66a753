"""CURVE keys: made on first use with a private secret, and the trust commands of both sides."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import zmq
import zmq.auth

from agent.daemon.zap import TrustedKeys
from coordinator.hosts.keys import known_hosts
from shared.io.keys import PUBLIC_MODE, new_keypair, own_keypair
from shared.io.trust import list_trusted, trust, trusted_dir
from tests.fleet_support import cli


def test_keypair_is_made_once(fleet_home: Path) -> None:
    first = own_keypair()
    assert own_keypair() == first
    secret = fleet_home / "keys" / "self.key_secret"
    public, loaded_secret = zmq.auth.load_certificate(secret)
    assert (public.decode(), loaded_secret.decode()) == (first.public, first.secret)
    assert zmq.curve_public(first.secret.encode()).decode() == first.public


def test_the_secret_is_private(fleet_home: Path) -> None:
    own_keypair()
    secret = fleet_home / "keys" / "self.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE((fleet_home / "keys").stat().st_mode) == 0o700
    assert zmq.auth.load_certificate(fleet_home / "keys" / "self.key")[1] is None


def test_a_permissive_umask_opens_no_key_file(fleet_home: Path) -> None:
    """umask 000: the secret and every trusted key stay 0600, the public key 0644 (README,
    "Data": a public key may be read, never written, by others)."""
    old = os.umask(0)
    try:
        own_keypair()
        trust(new_keypair()[0], name="lab-mac")
    finally:
        os.umask(old)
    keys = fleet_home / "keys"
    modes = {str(p.relative_to(keys)): stat.S_IMODE(p.stat().st_mode) for p in keys.rglob("*")}
    assert modes == {
        "self.key_secret": 0o600,
        "self.key": PUBLIC_MODE,
        "trusted": 0o700,
        "trusted/lab-mac.key": 0o600,
    }
    assert PUBLIC_MODE == 0o644


@pytest.mark.slow
def test_agent_keys_show_prints_the_public_key_alone() -> None:
    result = cli("agent", "keys", "show")
    assert result.returncode == 0, result.stderr
    assert result.stdout == own_keypair().public + "\n"


@pytest.mark.slow
def test_agent_trust_list_revoke(fleet_home: Path) -> None:
    key = "[b]" + new_keypair()[0][3:]  # Z85 text Rich would take for markup: shown as it is
    trusted = cli("agent", "keys", "trust", key, "--name", "lab-mac")
    assert trusted.returncode == 0 and key in trusted.stderr
    listed = cli("agent", "keys", "list")
    assert listed.stdout == f"lab-mac\t{key}\n"
    certificate = fleet_home / "keys" / "trusted" / "lab-mac.key"
    assert zmq.auth.load_certificates(certificate.parent) == {key.encode(): True}
    renamed = cli("agent", "keys", "trust", key, "--name", "renamed")
    assert renamed.returncode == 0
    assert [e.name for e in list_trusted()] == ["renamed"]
    revoked = cli("agent", "keys", "revoke", "renamed")
    assert revoked.returncode == 0 and key in revoked.stderr
    assert list_trusted() == []
    missing = cli("agent", "keys", "revoke", key)
    assert missing.returncode == 1 and "no trusted key" in missing.stderr


@pytest.mark.slow
def test_a_bad_key_is_a_usage_error() -> None:
    short = cli("agent", "keys", "trust", "tooshort")
    assert short.returncode == 2 and "40 Z85 characters" in short.stderr


@pytest.mark.slow
def test_a_bad_name_is_a_usage_error() -> None:
    key = new_keypair()[0]
    bad_name = cli("agent", "keys", "trust", key, "--name", "../evil")
    assert bad_name.returncode == 2 and "bad name" in bad_name.stderr


def test_a_name_is_not_silently_reused() -> None:
    trust(new_keypair()[0], "lab")
    clash = cli("agent", "keys", "trust", new_keypair()[0], "--name", "lab")
    assert clash.returncode == 2 and "already used" in clash.stderr


def test_the_zap_check_sees_a_new_trust_at_once() -> None:
    key = zmq.curve_keypair()[0]
    check = TrustedKeys(trusted_dir())
    assert not check.callback("*", key)
    trust(key.decode())
    assert check.callback("*", key)


def test_the_zap_check_sees_a_revocation_at_once() -> None:
    key = zmq.curve_keypair()[0]
    check = TrustedKeys(trusted_dir())
    entry = trust(key.decode())
    assert check.callback("*", key)
    entry.path.unlink()
    assert not check.callback("*", key)


@pytest.mark.slow
def test_coordinator_keys() -> None:
    shown = cli("coordinator", "keys", "show")
    assert shown.stdout == own_keypair().public + "\n"
    key = new_keypair()[0]
    assert cli("coordinator", "keys", "add", "mac1", key).returncode == 0
    assert cli("coordinator", "keys", "add", "[::1]:6000", key).returncode == 0
    assert known_hosts() == {"mac1:5555": key, "[::1]:6000": key}
    bad = cli("coordinator", "keys", "add", "mac1", "nope")
    assert bad.returncode == 2 and "key" in bad.stderr


def test_generated_keys_never_start_with_a_dash() -> None:
    """Z85 has '-', and `agent keys trust -abc...` would read as an option."""
    assert not any(new_keypair()[0].startswith("-") for _ in range(500))


def dash_key() -> str:
    """A valid public key that starts with '-' (one in 85 does)."""
    while True:
        public = zmq.curve_keypair()[0].decode()
        if public.startswith("-"):
            return public


@pytest.mark.slow
def test_a_key_that_starts_with_a_dash_is_taken_everywhere_a_key_is(fleet_home: Path) -> None:
    key = dash_key()
    trusted = cli("agent", "keys", "trust", key, "--name", "dashing")
    assert trusted.returncode == 0, trusted.stderr
    assert [(e.name, e.key) for e in list_trusted()] == [("dashing", key)]
    added = cli("coordinator", "keys", "add", "127.0.0.1:5555", key)
    assert added.returncode == 0, added.stderr
    assert known_hosts()["127.0.0.1:5555"] == key
    revoked = cli("agent", "keys", "revoke", key)
    assert revoked.returncode == 0, revoked.stderr
    assert list_trusted() == []


def test_an_unknown_option_is_still_a_bad_key_not_accepted() -> None:
    result = cli("agent", "keys", "trust", "--nmae", "x")
    assert result.returncode == 2
