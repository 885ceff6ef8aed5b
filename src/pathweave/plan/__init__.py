"""Plans and planners: one registry, one result type for every policy.

Examples
--------
>>> import pathweave as pw
>>> pw.plan.policies()
['static', 'deepep', 'multirail', 'mwu', 'optimal', 'hscore', 'mwu_time', 'mintime']
>>> pw.plan.DEFAULT_POLICY
'mintime'
"""

# isort: off
# Importing the planners registers them; this order is the order of policies().
from pathweave.plan import static, deepep, multirail, mwu, optimal, hscore, mintime  # noqa: F401
# isort: on
from pathweave.plan._plan import Plan, Route
from pathweave.plan.mintime import replan
from pathweave.plan.pinned import pinned
from pathweave.plan.registry import (
    DEFAULT_POLICY,
    Policy,
    baselines,
    make,
    policies,
    policy_info,
    register,
)
from pathweave.plan.timemodel import predict_time

__all__ = [
    "DEFAULT_POLICY", "Plan", "Policy", "Route", "baselines", "make", "pinned", "policies",
    "policy_info", "predict_time", "register", "replan",
]
