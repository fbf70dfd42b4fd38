"""A stand-in for the `kind` command (v0.24.0), for tests on a machine without kind.

It answers the subcommands mlbench uses with kind's own messages, stream (stderr for progress,
stdout for data) and exit codes, as kind v0.24.0 prints them, and keeps its state where kind
keeps it: in node containers of the Docker engine at $DOCKER_HOST, labelled
``io.x-k8s.kind.cluster=<name>``. A node is a container of a tiny image (this machine's
/bin/sleep) instead of kindest/node, and `load docker-image` copies the image archive into every
node (where kind would run `ctr images import`), so a test can see what each node received.
"""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import docker
import yaml

VERSION = "kind v0.24.0 go1.22.6 linux/amd64"
NODE_IMAGE = "kindest/node:v1.31.0"
STANDIN_NODE_IMAGE = "mlbench-test/kind-node:standin"
LABEL = "io.x-k8s.kind.cluster"
ROLE_LABEL = "io.x-k8s.kind.role"


def err(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def client() -> docker.DockerClient:
    try:
        c = docker.from_env()
        c.ping()
        return c
    except Exception:
        err("ERROR: failed to create cluster: failed to get docker info: command \"docker info "
            "--format '{{json .}}'\" failed with error: exit status 1")
        sys.exit(1)


def nodes(c: docker.DockerClient, name: str) -> list:
    return sorted(c.containers.list(all=True, filters={"label": f"{LABEL}={name}"}),
                  key=lambda n: n.name)


def node_image(c: docker.DockerClient) -> str:
    """An image whose containers keep running: /bin/sleep with its shared libraries."""
    try:
        c.images.get(STANDIN_NODE_IMAGE)
        return STANDIN_NODE_IMAGE
    except docker.errors.ImageNotFound:
        pass
    libs = [line.split("=>")[-1].split("(")[0].strip()
            for line in subprocess.run(["ldd", "/bin/sleep"], capture_output=True,
                                       text=True).stdout.splitlines()]
    files = ["/bin/sleep", *[lib for lib in libs if lib.startswith("/")]]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in files:
            tar.add(os.path.realpath(path), arcname="root" + path)
        dockerfile = b'FROM scratch\nCOPY root/ /\nENTRYPOINT ["/bin/sleep"]\nCMD ["infinity"]\n'
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    buffer.seek(0)
    c.images.build(fileobj=buffer, custom_context=True, tag=STANDIN_NODE_IMAGE)
    return STANDIN_NODE_IMAGE


def kubeconfig(name: str, port: int) -> str:
    fake = base64.b64encode(f"stand-in data of kind cluster {name}".encode()).decode()
    context = f"kind-{name}"
    return yaml.safe_dump({
        "apiVersion": "v1",
        "clusters": [{"cluster": {"certificate-authority-data": fake,
                                  "server": f"https://127.0.0.1:{port}"}, "name": context}],
        "contexts": [{"context": {"cluster": context, "user": context}, "name": context}],
        "current-context": context, "kind": "Config", "preferences": {},
        "users": [{"name": context, "user": {"client-certificate-data": fake,
                                             "client-key-data": fake}}],
    }, sort_keys=False)


def option(args: list[str], flag: str, default: str | None = None) -> str | None:
    return args[args.index(flag) + 1] if flag in args else default


def create(args: list[str]) -> int:
    name = option(args, "--name", "kind")
    c = client()
    if nodes(c, name):
        err(f'ERROR: failed to create cluster: node(s) already exist for a cluster with the '
            f'name "{name}"')
        return 1
    config = yaml.safe_load(Path(option(args, "--config")).read_text()) if "--config" in args \
        else {"nodes": [{"role": "control-plane"}]}
    if config.get("apiVersion") != "kind.x-k8s.io/v1alpha4" or config.get("kind") != "Cluster":
        err("ERROR: failed to create cluster: unknown apiVersion or kind in the config")
        return 1
    roles = [n["role"] for n in config["nodes"]]
    if roles.count("control-plane") != 1 or roles[0] != "control-plane":
        err("ERROR: failed to create cluster: expected one control-plane node first")
        return 1
    image = config["nodes"][0].get("image", NODE_IMAGE)
    err(f'Creating cluster "{name}" ...', f" ✓ Ensuring node image ({image}) 🖼",
        " ✓ Preparing nodes " + "📦 " * len(roles), " ✓ Writing configuration 📜",
        " ✓ Starting control-plane 🕹️", " ✓ Installing CNI 🔌",
        " ✓ Installing StorageClass 💾")
    base = node_image(c)
    workers = 0
    for role in roles:
        suffix = "control-plane" if role == "control-plane" else (
            "worker" + (str(workers + 1) if workers else ""))
        workers += role == "worker"
        c.containers.run(base, detach=True, name=f"{name}-{suffix}", network_mode="none",
                         labels={LABEL: name, ROLE_LABEL: role})
    if workers:
        err(" ✓ Joining worker nodes 🚜")
    port = 30000 + sum(map(ord, name)) % 10000
    target = Path(option(args, "--kubeconfig", str(Path.home() / ".kube" / "config")))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(kubeconfig(name, port))
    err(f'Set kubectl context to "kind-{name}"', "You can now use your cluster with:", "",
        f"kubectl cluster-info --context kind-{name}", "",
        "Thanks for using kind! 😊")
    return 0


def main(argv: list[str]) -> int:
    command = " ".join(argv[:2])
    if argv[:1] == ["version"]:
        print(VERSION)
        return 0
    if command == "get clusters":
        names = sorted({n.labels[LABEL] for n in client().containers.list(
            all=True, filters={"label": LABEL})})
        if not names:
            err("No kind clusters found.")
        for name in names:
            print(name)
        return 0
    if command == "create cluster":
        return create(argv[2:])
    name = option(argv, "--name", "kind")
    if command == "get kubeconfig":
        if not nodes(client(), name):
            err(f"ERROR: could not locate any control plane nodes for cluster named '{name}'. "
                "Use the --name option to select a different cluster")
            return 1
        print(kubeconfig(name, 30000 + sum(map(ord, name)) % 10000), end="")
        return 0
    if command == "load docker-image":
        c, image = client(), argv[2]
        try:
            found = c.images.get(image)
        except docker.errors.ImageNotFound:
            err(f'ERROR: image: "{image}" not present locally')
            return 1
        targets = nodes(c, name)
        if not targets:
            err(f'ERROR: no nodes found for cluster "{name}"')
            return 1
        archive = b"".join(found.save(named=True))
        for node in targets:
            err(f'Image: "{image}" with ID "{found.id}" not yet present on node "{node.name}", '
                "loading...")
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                info = tarfile.TarInfo(f"kind/images/{image.replace('/', '_')}.tar")
                info.size = len(archive)
                tar.addfile(info, io.BytesIO(archive))
            node.put_archive("/", buffer.getvalue())
        return 0
    if command == "delete cluster":
        c = client()
        err(f'Deleting cluster "{name}" ...')
        removed = nodes(c, name)
        for node in removed:
            node.remove(force=True)
        if removed:
            err("Deleted nodes: [" + " ".join(f'"{n.name}"' for n in removed) + "]")
        return 0
    err(f"ERROR: unknown command {command!r} for \"kind\"")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
