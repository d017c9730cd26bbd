"""The ``quorra`` command: server, simulator, benchmarks, pipeline, and a small client.

Sub-commands import their modules lazily so that ``quorra sim`` does not load FastAPI
and ``quorra serve`` does not load PySpark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.client_cli import register as register_client_commands
from app.queue_cli import register as register_queue_commands

cli = typer.Typer(
    name="quorra",
    help="Quorra: a Raft-replicated queue platform.",
    no_args_is_help=True,
    add_completion=False,
)

_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


_CLUSTER = "Cluster (see README, Running a cluster)"


@cli.command()
def serve(
    data_dir: Annotated[Path, typer.Option(help="Directory for all node data.")] = Path("./data"),
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
    node_id: Annotated[
        str | None,
        typer.Option(help="This node's id (env QUORRA_NODE_ID).", rich_help_panel=_CLUSTER),
    ] = None,
    cluster_listen: Annotated[
        str | None,
        typer.Option(
            help="host:port for the peers (env QUORRA_CLUSTER_LISTEN).", rich_help_panel=_CLUSTER
        ),
    ] = None,
    peers: Annotated[
        str | None,
        typer.Option(
            help="The other nodes: n2@host:port,n3@host:port (env QUORRA_PEERS).",
            rich_help_panel=_CLUSTER,
        ),
    ] = None,
    join: Annotated[
        str | None,
        typer.Option(
            help="host:port of a node of a running cluster to join, on this node's first"
            " start (env QUORRA_CLUSTER_JOIN).",
            rich_help_panel=_CLUSTER,
        ),
    ] = None,
    cluster_id: Annotated[
        str | None,
        typer.Option(
            help="A new cluster's id; derived from the secret and the node ids when not"
            " given (env QUORRA_CLUSTER_ID).",
            rich_help_panel=_CLUSTER,
        ),
    ] = None,
    cluster_secret_file: Annotated[
        str | None,
        typer.Option(
            help="File holding the cluster secret (env QUORRA_CLUSTER_SECRET_FILE; or the"
            " secret itself in QUORRA_CLUSTER_SECRET, never on the command line).",
            rich_help_panel=_CLUSTER,
        ),
    ] = None,
    cluster_tls_cert: Annotated[
        str | None,
        typer.Option(
            help="PEM certificate (env QUORRA_CLUSTER_TLS_CERT).", rich_help_panel=_CLUSTER
        ),
    ] = None,
    cluster_tls_key: Annotated[
        str | None,
        typer.Option(
            help="PEM private key (env QUORRA_CLUSTER_TLS_KEY).", rich_help_panel=_CLUSTER
        ),
    ] = None,
    cluster_tls_ca: Annotated[
        str | None,
        typer.Option(
            help="PEM CA the peers' certificates must chain to (mutual TLS)"
            " (env QUORRA_CLUSTER_TLS_CA).",
            rich_help_panel=_CLUSTER,
        ),
    ] = None,
) -> None:
    """Start a server: a single node, or with --peers (or --join) a node of a cluster."""
    import gc
    import os

    # The engine uses numpy for packed arrays, never its linear algebra: OpenBLAS's thread
    # pool (one per core, started when numpy loads) would cost ~50 ms of the start and
    # idle threads for the life of the server.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    # Start-up makes hundreds of thousands of objects that live as long as the process
    # (modules, classes, routes, models) and almost no garbage: collecting while they are
    # made costs ~130 ms of a ~900 ms start. The app's lifespan freezes what start-up
    # built and turns collection back on once the server is ready.
    gc.disable()
    from app.cluster_identity import settled_settings
    from app.cluster_settings import ClusterFlags, StartRefused
    from app.settings import Settings

    flags = ClusterFlags(
        node_id=node_id,
        listen=cluster_listen,
        peers=peers,
        join=join,
        cluster_id=cluster_id,
        secret_file=cluster_secret_file,
        tls_cert=cluster_tls_cert,
        tls_key=cluster_tls_key,
        tls_ca=cluster_tls_ca,
    )
    try:
        # Checked before the server's modules load, and before anything binds a port.
        settings = settled_settings(Settings.from_env(data_dir, host, port, cluster_flags=flags))
    except StartRefused as e:
        typer.echo(f"quorra serve: {e}", err=True)
        raise typer.Exit(e.exit_status) from None
    from app.server import run_server

    run_server(settings)


@cli.command("dev-cluster")
def dev_cluster(
    count: Annotated[int, typer.Argument(min=1, max=9, help="How many nodes.")] = 3,
    data_dir: Annotated[
        Path, typer.Option(help="Directory for the nodes' data, logs and secrets.")
    ] = Path("./data/dev-cluster"),
    port: Annotated[int, typer.Option(help="HTTP port of n1; nK uses port+K-1.")] = 8001,
    cluster_port: Annotated[
        int, typer.Option(help="Cluster port of n1; nK uses cluster-port+K-1.")
    ] = 7001,
) -> None:
    """Start COUNT local nodes of one cluster on 127.0.0.1; Ctrl-C stops them all."""
    from app.dev_cluster import run

    raise typer.Exit(run(count, data_dir, port, cluster_port))


@cli.command(context_settings=_PASSTHROUGH)
def sim(ctx: typer.Context) -> None:
    """Run the deterministic simulator (see `quorra sim --help`)."""
    from engine.sim.cli import main as sim_main

    raise typer.Exit(sim_main(list(ctx.args)))


@cli.command(context_settings=_PASSTHROUGH)
def bench(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="Benchmark name.")] = ""
) -> None:
    """Run a benchmark and print its JSON figures (`quorra bench --help` lists them)."""
    import bench as benches

    raise typer.Exit(benches.run(name, list(ctx.args)))


@cli.command(context_settings=_PASSTHROUGH)
def pipeline(ctx: typer.Context) -> None:
    """Spark pipeline jobs (see `quorra pipeline --help`)."""
    from pipeline.cli import main as pipeline_main

    raise typer.Exit(pipeline_main(list(ctx.args)))


# User, token, publish and consume commands, queue commands and status; app.client_cli
# and app.queue_cli load neither FastAPI nor SQLAlchemy until one of their commands runs.
register_client_commands(cli)
register_queue_commands(cli)


def main() -> None:
    cli()


if __name__ == "__main__":  # python -m app.cli, as well as the quorra script
    main()
