"""Pod Security Standards checks, transcribed from the published policy table
(https://kubernetes.io/docs/concepts/security/pod-security-standards/, baseline + restricted)."""

from __future__ import annotations

from typing import Any

# Volume types the restricted profile allows.
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", []),
            *spec.get("ephemeralContainers", [])]


def _effective(pod_sc: dict[str, Any], c_sc: dict[str, Any], key: str) -> Any:
    return c_sc.get(key, pod_sc.get(key))


def violations(spec: dict[str, Any], *, allow_host_paths: frozenset[str] = frozenset()) -> list[str]:
    """Every restricted-profile rule the pod spec breaks (empty: compliant).

    allow_host_paths: read-only hostPath mounts accepted anyway (the agent's /sys), so the rest
    of the profile can still be enforced on that pod.
    """
    out: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"{key} is true")
    for sysctl in pod_sc.get("sysctls", []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"unsafe sysctl {sysctl.get('name')}")
    host_volumes: set[str] = set()
    for vol in spec.get("volumes", []):
        kinds = set(vol) - {"name"}
        if kinds == {"hostPath"} and vol["hostPath"].get("path") in allow_host_paths:
            host_volumes.add(vol["name"])
            continue
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {vol['name']} uses {sorted(kinds - RESTRICTED_VOLUMES)}")
    for c in _containers(spec):
        name = c.get("name", "?")
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities {caps['add']}")
        if _effective(pod_sc, sc, "runAsNonRoot") is not True:
            out.append(f"{name}: runAsNonRoot is not true")
        if _effective(pod_sc, sc, "runAsUser") == 0:
            out.append(f"{name}: runAsUser is 0")
        seccomp = (_effective(pod_sc, sc, "seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile.type is {seccomp!r}")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount is {sc['procMount']}")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                out.append(f"{name}: hostPort {port['hostPort']}")
        for mount in c.get("volumeMounts", []):
            if mount["name"] in host_volumes and not mount.get("readOnly"):
                out.append(f"{name}: hostPath volume {mount['name']} is mounted writable")
    return out
