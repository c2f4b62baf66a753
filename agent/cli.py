"""`agent`: the per-Mac command line (exit codes: shared.exit_codes)."""

from __future__ import annotations

from agent.bench_cli import bench
from agent.doctor_cli import doctor_command
from agent.run_cli import run_command
from agent.serve_cli import keys_app, serve_command
from agent.service_cli import install_command, service_status_command, uninstall_command
from agent.thermal.cli import temp_command
from shared.io.cli import fleet_app

app = fleet_app("agent", "mlx-fleet agent: true MLX benchmarks and thermal safety on this Mac.")


app.command()(bench)
app.command("temp")(temp_command)
app.command("run", context_settings={"allow_interspersed_args": False})(run_command)
app.command("install")(install_command)
app.command("uninstall")(uninstall_command)
app.command("service-status")(service_status_command)
app.command("doctor")(doctor_command)
app.command("serve")(serve_command)
app.add_typer(keys_app, name="keys")


def main() -> None:
    app()
