"""Commands: site (registered on the app in clusterjob.cli)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from clusterjob.cli.app import site_app
from clusterjob.cli.common import load_site
from clusterjob.cli.options import JsonOption, SiteOption

if TYPE_CHECKING:  # `clusterjob --help` imports every command module: not the site model
    from clusterjob.site.model import Site
    from clusterjob.site.nodeprobe import ProbeProgress


@site_app.command("validate")
def validate(
    files: Annotated[list[Path], typer.Argument(help="Site YAML files to check.")],
    as_json: JsonOption = False,
    compile_: Annotated[
        bool,
        typer.Option(
            "--compile",
            help="Also write each valid file's compiled node map beside it (FILE.nodes.json), "
            "which the Prolog reads on a node's first job instead of the YAML.",
        ),
    ] = False,
) -> None:
    """Check site configs; print every problem as file:line: key: message (exit 2 on errors)."""
    from clusterjob.site.admin import issue_record, validate_files, write_compiled

    results = validate_files(files, compiling=compile_)
    if as_json:
        records = [
            {
                "file": str(path),
                "ok": site is not None,
                "issues": [issue_record(i) for i in issues],
            }
            for path, site, issues in results
        ]
        print(json.dumps(records, indent=2))
    else:
        for path, site, issues in results:
            for issue in issues:
                print(issue)
            if site is not None:
                print(
                    f"{path}: ok (site {site.name}: {len(site.models)} models, "
                    f"{len(site.partitions)} partitions, {len(site.node_map.nodes)} nodes)"
                )
    if any(site is None for _, site, _ in results):
        raise typer.Exit(2)
    if compile_:
        for path, _site, _issues in results:
            written = write_compiled(path)
            print(f"{path}: compiled node map written to {written}", file=sys.stderr)


@site_app.command("show")
def show(site: SiteOption = None, as_json: JsonOption = False) -> None:
    """Show the site: models with aliases and GRES names, partitions and their GPUs."""
    from clusterjob.site.admin import format_site, site_summary

    loaded = load_site(site)
    if as_json:
        print(json.dumps(site_summary(loaded), indent=2))
    else:
        print("\n".join(format_site(loaded)))


@site_app.command("gres-conf")
def gres_conf(
    site: SiteOption = None,
    device_prefix: Annotated[
        str, typer.Option("--device-prefix", help="Device file prefix for File=.")
    ] = "/dev/nvidia",
) -> None:
    """Print gres.conf lines and slurm.conf Gres= values generated from the node map."""
    from clusterjob.site.admin import GRES_CONF_HEADER, gres_conf_lines, slurm_node_gres_lines

    loaded = load_site(site)
    print("\n".join(GRES_CONF_HEADER))
    print("\n".join(gres_conf_lines(loaded, device_prefix)))
    print("\n# slurm.conf: add these Gres= values to the NodeName lines (GresTypes=gpu)")
    print("\n".join(f"# {line}" for line in slurm_node_gres_lines(loaded)))


@site_app.command("schema")
def schema(
    reference: Annotated[
        bool,
        typer.Option("--reference", help="Print the key reference (Markdown) instead."),
    ] = False,
) -> None:
    """Print the site config's JSON Schema (for editors: yaml-language-server's $schema)."""
    from clusterjob.site.schema import json_schema, reference_markdown

    if reference:
        print(reference_markdown(), end="")
    else:
        print(json.dumps(json_schema(), indent=2))


@site_app.command("probe")
def probe(
    site: SiteOption = None,
    node: Annotated[
        str | None, typer.Option("--node", help="Node name (default: this host's short name).")
    ] = None,
    merge: Annotated[
        Path | None,
        typer.Option("--merge", help="Update (or add) this node's entry in this site file."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Read this node's GPUs (NVML) and print its node-map entry, in PCI bus order."""
    from clusterjob.errors import SiteNotFound
    from clusterjob.site.loader import load_site as load_file
    from clusterjob.site.probe import entry_yaml, merge_file
    from clusterjob.site.probe import probe as probe_node

    loaded: Site | None
    if merge is not None:
        loaded = load_file(merge)  # the models of the file being edited name the GPUs
    else:
        try:
            loaded = load_site(site)
        except SiteNotFound:
            if site is not None:
                raise
            loaded = None
    probed = probe_node(node, loaded)
    if merge is not None:
        result = merge_file(merge, probed)
        if as_json:
            record = {"file": str(result.path), "action": result.action, **probed.to_dict()}
            print(json.dumps(record, indent=2))
        else:
            print(result)
        return
    if as_json:
        print(json.dumps({"site": loaded.name if loaded else None, **probed.to_dict()}, indent=2))
        return
    where = f"site {loaded.name}" if loaded else "no site config found"
    print(f"# node_map entry for {probed.node} ({where}); paste under node_map:")
    print(entry_yaml(probed), end="")


@site_app.command("init")
def init(
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the site file here (default: print it)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the --out file if it exists.")
    ] = False,
    diff: Annotated[
        Path | None,
        typer.Option(
            "--diff",
            help="Compare the cluster's description with this site file: print each "
            "difference in models, GRES types, partitions, limits and syntax (exit 1 if any).",
        ),
    ] = None,
    probe: Annotated[
        bool,
        typer.Option(
            "--probe",
            help="Run one tiny job per node configuration (same GRES, features, CPUs, memory "
            "and partitions) that reads its GPUs' PCI bus order with `clusterjob site probe`, "
            "and fill the node map with it; also does --probe-syntax.",
        ),
    ] = False,
    probe_syntax: Annotated[
        bool,
        typer.Option(
            "--probe-syntax",
            help="Ask sbatch --test-only which GPU request forms the cluster takes (no job is "
            "created).",
        ),
    ] = False,
    all_nodes: Annotated[
        bool,
        typer.Option("--all-nodes", help="With --probe: one job per node, not per configuration."),
    ] = False,
    probe_timeout: Annotated[
        float,
        typer.Option(
            "--probe-timeout",
            help="With --probe: seconds for the jobs to run; those not done are cancelled and "
            "their nodes listed as not probed.",
            min=1,
        ),
    ] = 300.0,
    name: Annotated[
        str | None, typer.Option("--name", help="The site's name (default: Slurm's ClusterName).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Describe the live cluster as a commented site file (models, partitions, limits, QoS),
    for a cluster that has none; at most four Slurm calls (--probe: and one job per node
    configuration)."""
    from clusterjob.errors import UsageError
    from clusterjob.site.init import init_record, init_site, write_site
    from clusterjob.site.nodeprobe import ProbeJobs

    if all_nodes and not probe:
        raise UsageError("--all-nodes goes with --probe")
    jobs = None
    if probe:
        jobs = ProbeJobs(timeout=probe_timeout, each_node=all_nodes, progress=_probe_progress())
    result = init_site(name=name, probe=probe or probe_syntax, probe_jobs=jobs)
    if probe and sys.stderr.isatty():
        print(file=sys.stderr)  # end the progress line
    for line in result.plan.not_probed:
        print(f"not probed: {line}", file=sys.stderr)
    for issue in result.issues:  # warnings only: a file the loader refuses is an error
        print(issue, file=sys.stderr)
    differences = []
    if diff is not None:
        from clusterjob.site.compare import compare_sites
        from clusterjob.site.loader import load_site as load_file

        assert result.site is not None
        differences = compare_sites(load_file(diff), result.site)
    if out is not None:
        write_site(out, result.text, force=force)
        print(
            f"{out}: site {result.plan.site} written ({len(result.plan.models)} models, "
            f"{len(result.plan.partitions)} partitions; {result.facts.calls} Slurm calls"
            + (f", {sum(1 for p in result.probes if p.job_id)} probe jobs" if probe else "")
            + ")",
            file=sys.stderr,
        )
    if as_json:
        print(json.dumps(init_record(result, differences), indent=2))
    elif diff is not None:
        for d in differences:
            print(d.said(str(diff), "the cluster"))
        print(f"{diff} and the live cluster: {len(differences)} differences")
    elif out is None:
        print(result.text, end="")
    if differences:
        raise typer.Exit(1)


def _probe_progress() -> Callable[[ProbeProgress], None]:
    """Probe jobs' progress on stderr: one line redrawn on a terminal, plain lines otherwise."""
    tty = sys.stderr.isatty()

    def show(p: ProbeProgress) -> None:
        counts = f"[{p.done}/{p.total} done, {p.running} running, {p.pending} pending]"
        if tty:
            width = shutil.get_terminal_size().columns - 1
            print(f"\r\033[Kprobe jobs {counts} {p.events[-1]}"[: width + 4], end="",
                  file=sys.stderr, flush=True)  # fmt: skip
        else:
            print(f"probe jobs {counts} {p.events[-1]}", file=sys.stderr, flush=True)

    return show


@site_app.command("diff")
def diff(
    site: SiteOption = None,
    prolog_log: Annotated[
        Path | None,
        typer.Option(
            "--prolog-log",
            help="A Prolog JSON-lines log (the site's prolog.log, or the nodes' gathered): "
            "also report nodes whose last Prolog ran another clusterjob version.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Compare the node map with the live cluster (exit 1 when they differ)."""
    from clusterjob.site.drift import diff_site, format_report

    report = diff_site(load_site(site), prolog_log=prolog_log)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print("\n".join(format_report(report)))
    if not report.in_sync:
        raise typer.Exit(1)


@site_app.command("install-hooks")
def install_hooks(
    site: Annotated[
        Path, typer.Option("--site", help="The site file the nodes' Prolog reads (root-owned).")
    ],
    prefix: Annotated[
        Path, typer.Option("--prefix", help="Directory of the two wrappers, e.g. /etc/slurm.")
    ],
    cache_dir: Annotated[
        Path, typer.Option("--cache-dir", help="The Prolog's parsed-site cache.")
    ] = Path("/var/cache/clusterjob"),
    python: Annotated[
        Path | None,
        typer.Option(
            "--python",
            help="Interpreter of the nodes' clusterjob, whose whole import path only root may "
            "write (default: the one running this, if so).",
            show_default=False,
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env",
            help="NAME=VALUE for the hooks and the job's tasks, e.g. a driver library "
            "directory; $NAME expands when the hook runs. Repeatable.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the wrappers; write nothing.")
    ] = False,
    check: Annotated[
        bool,
        typer.Option("--check", help="Verify installed wrappers instead (exit 1 on a problem)."),
    ] = False,
) -> None:
    """Write the Slurm Prolog and TaskProlog wrappers (root-owned, 0755) and print the
    slurm.conf lines that name them."""
    import sys

    from clusterjob.errors import UsageError
    from clusterjob.node.wrappers import HookWrappers, check_wrappers, install_wrappers

    if dry_run and check:
        raise UsageError("--dry-run and --check exclude each other")
    pairs = [item.partition("=") for item in env or ()]
    if any(not sep for _, sep, _ in pairs):
        raise UsageError("--env takes NAME=VALUE")
    wrappers = HookWrappers(
        prefix=prefix.absolute(),
        python=python if python is not None else Path(sys.executable),
        site=site.absolute(),
        cache_dir=cache_dir.absolute(),
        environment=tuple((name, value) for name, _, value in pairs),
    )
    if check:
        result = check_wrappers(wrappers)
        for problem in result.problems:
            print(f"problem: {problem}")
        for note in result.notes:
            print(f"note: {note}")
        print(f"{wrappers.prefix}: " + ("hooks ok" if result.ok else "hooks NOT ok"))
        if not result.ok:
            raise typer.Exit(1)
        return
    paths = install_wrappers(wrappers, dry_run=dry_run, default_python=python is None)
    if dry_run:
        for path, text in wrappers.files().items():
            print(f"# {path} (root, 0755; dry run: not written)")
            print(text)
    else:
        for path in paths:
            print(f"wrote {path} (root, 0755)")
    print("# slurm.conf (then `scontrol reconfigure`, or restart slurmd):")
    print("\n".join(wrappers.slurm_conf_lines()))
