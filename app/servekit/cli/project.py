"""``servekit save``, ``servekit build``, ``servekit requirements`` and ``servekit bench``: from
a running server to a project folder, from a folder to an image (and the packages it installs),
and how fast a model serves.

One command group of app/servekit/cli/ (its ``__init__`` registers them with :func:`register`
and hands the parsed arguments to :func:`run`).
"""

from __future__ import annotations

import argparse
import sys

from servekit.cli.shared import config_error_text

COMMANDS = ("save", "build", "requirements", "bench")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the subcommands of :data:`COMMANDS` to ``servekit``'s parser."""
    save = sub.add_parser("save", help="write what a running server serves as a project folder")
    save.add_argument("url", help="the server's HTTP URL, e.g. http://127.0.0.1:8000")
    save.add_argument("folder", help="where to write serve.yaml, requirements.txt, Dockerfile")
    save.add_argument("--token", help="bearer token (default: $SERVEKIT_TOKEN)")
    build = sub.add_parser("build", help="build the image of a project folder (docker/podman)")
    build.add_argument("folder", nargs="?", default=".", help="the project folder (its serve.yaml)")
    build.add_argument("--tag", "-t", help="image tag (default: the folder's name)")
    build.add_argument("--base", help="servekit's image to build on (default: servekit:VERSION)")
    build.add_argument(
        "--include-models",
        action="store_true",
        help="fetch serve.yaml's remote models (s3://, gs://, az://, https://) now and bake "
        "them into the image (default: the container fetches them when it starts)",
    )
    requirements = sub.add_parser(
        "requirements",
        help="print CONFIG's server.requirements, one per line (what a project image installs)",
    )
    requirements.add_argument("config", nargs="?", default="serve.yaml", help="the serve.yaml")
    bench = sub.add_parser("bench", help="measure a model of a running server (HTTP and gRPC)")
    bench.add_argument("url", help="the server's HTTP URL")
    bench.add_argument("model", help="the model's name")
    bench.add_argument(
        "--concurrency", default="1,16,64", help="comma-separated in-flight request counts"
    )
    bench.add_argument("--seconds", type=float, default=5.0, help="per protocol and concurrency")
    bench.add_argument("--token", help="bearer token (default: $SERVEKIT_TOKEN)")
    bench.add_argument(
        "--grpc",
        metavar="HOST:PORT",
        help="where gRPC is reached, when not at the URL's host and the port the server reports "
        "(a port mapping such as -p 9001:8001) (default: the server's reported port)",
    )
    bench.add_argument(
        "--example",
        metavar="ROWS.csv",
        help="a CSV file with a header of input names; its first row is what each request "
        "sends (default: inputs made from the model's metadata)",
    )
    bench.add_argument(
        "--timeout", type=float, help="a deadline per request in seconds (default: none)"
    )


def run(args: argparse.Namespace) -> int:
    from servekit.config.loader import ConfigError
    from servekit.errors import ServeError

    try:
        if args.command == "save":
            return _save(args)
        if args.command == "build":
            return _build(args)
        if args.command == "requirements":
            return _requirements(args)
        return _bench(args)
    except ConfigError as exc:
        print(config_error_text(exc), file=sys.stderr)
        return 1
    except (ConnectionError, ServeError, ValueError) as exc:
        print(f"servekit: {exc}", file=sys.stderr)
        return 1


def _save(args: argparse.Namespace) -> int:
    from servekit.client.remote import connect

    server = connect(args.url, token=args.token)
    try:
        folder = server.save(args.folder)
    finally:
        server.close()
    print(f"servekit: saved {args.url} to {folder}")
    for note in server.missing:
        print(f"servekit: incomplete: {note}", file=sys.stderr)
    return 1 if server.missing else 0


def _build(args: argparse.Namespace) -> int:
    from servekit.project import build as building

    try:
        kwargs = {"base": args.base} if args.base else {}
        built = building.build(args.folder, args.tag, include_models=args.include_models, **kwargs)
    except building.BuildError as exc:
        print(f"servekit: {exc}", file=sys.stderr)
        return 1
    print(f"servekit: built {built.tag} with {built.engine}; run it with:\n  {built.run_command()}")
    print(f"servekit: {built.public_hint()}")
    return 0


def _requirements(args: argparse.Namespace) -> int:
    """The project Dockerfile runs this to learn what to pip-install besides requirements.txt:
    the entries come out validated (app/servekit/config/pip_requirements.py), one per line."""
    from servekit.project.requirements import declared

    for line in declared(args.config):
        print(line)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from servekit.client.bench import csv_example, run_benchmark
    from servekit.client.remote import connect

    try:
        levels = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
    except ValueError:
        print("servekit: --concurrency takes numbers, e.g. 1,16,64", file=sys.stderr)
        return 2
    if args.grpc is not None:
        host, _, port = args.grpc.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            print(f"servekit: --grpc takes HOST:PORT, e.g. 127.0.0.1:9001, not {args.grpc!r}",
                  file=sys.stderr)  # fmt: skip
            return 2
    server = connect(args.url, token=args.token, grpc_target=args.grpc)
    try:
        if server.grpc_target is None:
            print(
                "servekit: gRPC is not measured: the server reports no gRPC port "
                "(pass --grpc HOST:PORT if it has one)",
                file=sys.stderr,
            )
        example = csv_example(args.example) if args.example else None
        table = run_benchmark(
            server,
            args.model,
            concurrency=levels,
            seconds=args.seconds,
            example=example,
            timeout=args.timeout,
            progress_to=sys.stderr,
        )
    finally:
        server.close()
    print(table.text())
    if not table.errors:
        return 0
    print(f"servekit: {table.errors} requests failed", file=sys.stderr)
    if any(row.protocol == "grpc" and row.errors for row in table.rows):
        print(
            f"servekit: gRPC was sent to {server.grpc_target}"
            + ("" if args.grpc else " (the port the server reports)")
            + "; behind a port mapping pass --grpc HOST:PORT",
            file=sys.stderr,
        )
    return 1
