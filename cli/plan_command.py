"""`capsules plan`: parse the request, call capsule_core.explain.engine, write what
capsule_core.render.explain renders.

Kept light at import time: numpy, the registry of plans and nvcc load inside the command.
"""

from enum import Enum
from typing import Annotated, Optional

import typer

from cli.options import ArchOption, LibraryOption, load_libraries


class Direction(str, Enum):
    fwd = "fwd"
    bwd = "bwd"


def plan(
    op: Annotated[
        str,
        typer.Argument(help="An op name (softmax) or a kernel capsule's name (native_cuda.softmax, tinylib.softmax)."),
    ],
    inputs: Annotated[
        Optional[list[str]],
        typer.Option(
            "--input",
            "-i",
            help="NAME=SHAPE, e.g. x=8x4096 (() for a scalar); repeat for each input, and repeat a list "
            "input's name for each of its arrays. An input whose every dimension the others name "
            "(linear's b, layer_norm's gamma and beta) may be left out.",
        ),
    ] = None,
    params: Annotated[
        Optional[list[str]],
        typer.Option(
            "--param", "-p", help="K=V, read as the op's parameter schema says: 1e-5, 2, none, 1x1 or 1,1 for a tuple."
        ),
    ] = None,
    direction: Annotated[
        Direction, typer.Option(help="The forward launches or the backward (VJP) ones.")
    ] = Direction.fwd,
    arch: Annotated[
        Optional[ArchOption],
        typer.Option(
            help="Occupancy rules and kernel build of this architecture (default: the local GPU's, else sm_90 on a "
            "reference H200)."
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON (docs/plan-schema.md).")] = False,
    library: LibraryOption = None,
):
    """The launches a shape gets, like a database's EXPLAIN; no GPU needed.

    Per launch: the entry point, grid, block, dynamic and static shared memory, registers and
    spills (ptxas, through the kernel cache; without nvcc the note column says so), theoretical
    occupancy by the CUDA occupancy calculator's rules and what limits it, blocks per SM, SMs
    used and waves on the device: the local GPU, else a named reference device (H200, 132 SMs).
    The footer gives the roofline floor: the cost model's bytes over the nominal memory
    bandwidth and its flops over the FP32 FMA peak. Exit 0; 1 when the plan breaks a launch
    rule; 2 for a request the op refuses (shape, parameter, unknown op).

    Example: capsules plan linear --input x=8x4096 --input w=4096x4096
    """
    import json

    from capsule_core import __version__
    from capsule_core.errors import InputError, UnknownNameError
    from capsule_core.explain import engine as explain
    from capsule_core.render import explain as plan_report
    from cli.common import EXIT_USAGE, EXIT_VIOLATION, fail

    load_libraries(library)
    try:
        _, spec = explain.resolve_op(op)
        shapes = explain.parse_inputs(spec, inputs or ())
        values = explain.parse_params(spec, params or ())
        result = explain.explain(op, shapes, values, direction.value, arch.value if arch else None)
    except (InputError, UnknownNameError, explain.PlanRequestError) as exc:
        raise fail(str(exc), EXIT_USAGE)
    if json_out:
        typer.echo(json.dumps(plan_report.plan_record(result, __version__), indent=2, ensure_ascii=False))
    else:
        typer.echo(plan_report.render_plan(result))
    raise typer.Exit(EXIT_VIOLATION if result.problems else 0)
