"""Plans and planners: one registry, one result type for every policy.

Examples
--------
>>> import pathweave as pw
>>> pw.plan.policies()
['static', 'multirail', 'mwu', 'optimal', 'hscore']
"""

from pathweave.plan import hscore, multirail, mwu, optimal, static  # noqa: F401  (registers)
from pathweave.plan._plan import Plan, Route
from pathweave.plan.registry import Policy, make, policies, policy_info, register

__all__ = ["Plan", "Policy", "Route", "make", "policies", "policy_info", "register"]
