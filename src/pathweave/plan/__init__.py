"""Plans and planners: one registry, one result type for every policy.

Examples
--------
>>> import pathweave as pw
>>> pw.plan.policies()
['static', 'multirail', 'mwu', 'optimal', 'hscore']
"""

# isort: off
# Importing the planners registers them; this order is the order of policies().
from pathweave.plan import static, multirail, mwu, optimal, hscore  # noqa: F401
# isort: on
from pathweave.plan._plan import Plan, Route
from pathweave.plan.pinned import pinned
from pathweave.plan.registry import Policy, make, policies, policy_info, register

__all__ = [
    "Plan", "Policy", "Route", "make", "pinned", "policies", "policy_info", "register",
]
