"""How a round game evaluates coalitions: executors (fast with a stacked, vmap or fused head; batched;
naive), the one planner that picks them, and what they share (contexts, memory, coalition states)."""

from fedsv.valuation.round.executors.base import Executor
from fedsv.valuation.round.executors.compute import Compute, Memory
from fedsv.valuation.round.executors.planner import MODES, plan_executor

__all__ = ["MODES", "Compute", "Executor", "Memory", "plan_executor"]
