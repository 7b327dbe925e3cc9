"""What a try says: the instruction of each target (spec section 3), without the simulator's imports (the engines
folder embeds every one of them: engines.build)."""

from __future__ import annotations

SHAPES = ("circle", "square", "triangle")  # the blocks, also the board cell order (env.geometry re-exports it)
INSTRUCTION = "put the {shape} block into the {shape} hole"
INSTRUCTION_FULL_BOARD = "put every block into its matching hole"


def all_instructions() -> tuple[str, ...]:
    """Every instruction a try of any task list says: one per target shape, and the full board's."""
    return tuple(INSTRUCTION.format(shape=s) for s in SHAPES) + (INSTRUCTION_FULL_BOARD,)
