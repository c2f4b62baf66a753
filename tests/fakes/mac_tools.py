#!/usr/bin/env python3
"""A stand-in for macOS's `sysctl`, `sw_vers`, `ioreg` and `system_profiler`, answering from the
captures of one Mac in tests/fixtures/mac/$FAKE_MAC (its README says where each comes from).

Installed on PATH under each tool's name. Behaviour follows the real tools:
- `sysctl NAME...` prints `NAME: value` lines, `sysctl -n NAME...` the values alone; an unknown
  name prints `sysctl: unknown oid 'NAME'` on stderr and the exit status is 1 (sysctl(8)).
- `sw_vers -productVersion` prints the version alone (sw_vers(1)).
- `ioreg ... AGXAccelerator ...` prints the captured accelerator block (nothing when the folder
  has none); `system_profiler SPDisplaysDataType -json` prints the captured JSON.
$FAKE_SYSCTL ("name=value,...") changes or adds sysctl values: a translated process
(`sysctl.proc_translated=1`), an old macOS (`kern.osproductversion=13.6.7`), an Intel Mac
(`hw.optional.arm64=0`).
"""

import os
import sys
from pathlib import Path

MAC = Path(__file__).resolve().parent.parent / "fixtures" / "mac" / os.environ["FAKE_MAC"]
name, args = Path(sys.argv[0]).name, sys.argv[1:]


def sysctl_values() -> dict[str, str]:
    values = dict(
        line.split(": ", 1) for line in (MAC / "sysctl.txt").read_text().splitlines() if line
    )
    for item in filter(None, os.environ.get("FAKE_SYSCTL", "").split(",")):
        key, _, value = item.partition("=")
        values[key] = value
    return values


def capture(file: str) -> None:
    path = MAC / file
    if path.exists():
        sys.stdout.write(path.read_text())


if name == "sysctl":
    values, bare = sysctl_values(), args[:1] == ["-n"]
    status = 0
    for key in args[1:] if bare else args:
        if key in values:
            print(values[key] if bare else f"{key}: {values[key]}")
        else:
            print(f"sysctl: unknown oid '{key}'", file=sys.stderr)
            status = 1
    sys.exit(status)
if name == "sw_vers":
    version = sysctl_values().get("kern.osproductversion")
    if version is None:
        sys.exit(1)
    print(
        version
        if "-productVersion" in args
        else f"ProductName:\t\tmacOS\nProductVersion:\t\t{version}"
    )
elif name == "ioreg":
    if "AGXAccelerator" in args:
        capture("ioreg-AGXAccelerator.txt")
elif name == "system_profiler":
    capture(f"system_profiler-{args[0]}.json")
