#!/usr/bin/env python3
"""Writes the seccomp profile cxltierd's container runs with: the container
engine's default profile (containers-common's seccomp.json, which podman and
CRI-O use) with move_pages allowed, which the default denies outright (EPERM)
whatever the capabilities. Nothing else changes: mbind, get_mempolicy and
memfd_create are allowed already, and the kernel still asks for CAP_SYS_NICE
before moving pages that other processes map (MPOL_MF_MOVE_ALL).

    python3 deploy/container/seccomp.py [DEFAULT.json] > cxltier-seccomp.json

DEFAULT.json: /usr/share/containers/seccomp.json when not given.
"""
import json
import sys

ALLOW = ["move_pages"]


def main() -> int:
    src = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/containers/seccomp.json"
    try:
        with open(src) as f:
            profile = json.load(f)
    except (OSError, ValueError) as e:
        print(f"seccomp.py: cannot read the default profile {src}: {e}", file=sys.stderr)
        return 2
    if "syscalls" not in profile:
        print(f"seccomp.py: {src} has no syscalls list: not a seccomp profile", file=sys.stderr)
        return 2
    for rule in profile["syscalls"]:
        if rule.get("action") != "SCMP_ACT_ALLOW":
            rule["names"] = [n for n in rule["names"] if n not in ALLOW]
    profile["syscalls"] = [r for r in profile["syscalls"] if r["names"]]
    profile["syscalls"].append({"names": ALLOW, "action": "SCMP_ACT_ALLOW", "args": [],
                                "comment": "cxltierd moves KV-cache pages between NUMA nodes",
                                "includes": {}, "excludes": {}})
    json.dump(profile, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
