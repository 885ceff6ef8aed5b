"""Plans and planners: one registry, one result type for every policy.

Examples
--------
>>> import pathweave as pw
>>> pw.plan.policies()
['static', 'deepep', 'multirail', 'mwu', 'optimal', 'hscore', 'mwu_time', 'mintime']
>>> pw.plan.DEFAULT_POLICY
'mintime'
"""

# A policy is one module that registers itself; registry.POLICIES names the
# modules (in the order of policies()) and imports them when first read.
from pathweave.plan._plan import Plan, Route
from pathweave.plan.mintime import replan
from pathweave.plan.pinned import pinned
from pathweave.plan.registry import (
    DEFAULT_POLICY,
    POLICIES,
    Policy,
    baselines,
    make,
    policies,
    policy_info,
    register,
)
from pathweave.plan.timemodel import predict_time

__all__ = [
    "DEFAULT_POLICY", "POLICIES", "Plan", "Policy", "Route", "baselines", "make", "pinned",
    "policies", "policy_info", "predict_time", "register", "replan",
]
