"""The cost of one authorization decision with many ACL bindings loaded (issue 46's "an
authorization decision costs microseconds with 10,000 bindings loaded").

    python -m benchmarks.acl_decisions [--bindings 10000] [--decisions 200000] [--rounds 3]
        [--json FILE]

Loads ``--bindings`` bindings into Strata's ``StandardAuthorizer`` (in memory, no store): per
topic ``topic-<i>`` a LITERAL ALLOW READ and WRITE for its own user, a PREFIXED ALLOW per team
prefix, a few DENYs, group bindings and a LITERAL ``*``. Then, per scenario, the same decision
``--decisions`` times (Kafka's hot path: one Action per call, as Produce asks WRITE per topic):

- ``literal-allow``: a user's WRITE on its own topic (found by the literal index);
- ``prefixed-allow``: a team member's READ through its PREFIXED binding;
- ``deny``: a DENY that overrides an ALLOW;
- ``no-match``: a user with no binding on a resource that has some (DefaultDeny);
- ``super-user``: a ``super.users`` principal;
- ``metadata-1000``: one call with 1,000 DESCRIBE actions (a Metadata request for all topics),
  reported per action.

Prints microseconds per decision (best round) and the decisions per second it means.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from strata.security.acl_authorizer import (
    AccessControlEntry, AclBinding, ResourcePattern, StandardAuthorizer)
from strata.security.authorizer import (
    AclOperation as Op, AclPermissionType as Perm, Action, PatternType as PT, ResourceType as RT)
from strata.security.sasl import KafkaPrincipal

TEAMS = 50


def bindings(count: int) -> list[AclBinding]:
    """``count`` bindings over topics, team prefixes, groups and a wildcard."""
    out: list[AclBinding] = []
    i = 0
    while len(out) < count:
        user = f"User:user-{i}"
        topic = ResourcePattern(RT.TOPIC, f"topic-{i}", PT.LITERAL)
        out.append(AclBinding(topic, AccessControlEntry(user, "*", Op.WRITE, Perm.ALLOW)))
        out.append(AclBinding(topic, AccessControlEntry(user, "*", Op.READ, Perm.ALLOW)))
        if i % 10 == 0:
            out.append(AclBinding(ResourcePattern(RT.GROUP, f"group-{i}", PT.LITERAL),
                                  AccessControlEntry(user, "*", Op.READ, Perm.ALLOW)))
        if i % 100 == 0:
            out.append(AclBinding(topic, AccessControlEntry("User:blocked", "*", Op.WRITE,
                                                            Perm.DENY)))
        if i < TEAMS:
            out.append(AclBinding(ResourcePattern(RT.TOPIC, f"team-{i}.", PT.PREFIXED),
                                  AccessControlEntry(f"User:team-{i}", "*", Op.READ,
                                                     Perm.ALLOW)))
        i += 1
    out = out[:count - 1]
    out.append(AclBinding(ResourcePattern(RT.TOPIC, "*", PT.LITERAL),
                          AccessControlEntry("User:blocked", "*", Op.WRITE, Perm.ALLOW)))
    return out


def load(count: int) -> StandardAuthorizer:
    a = StandardAuthorizer(super_users=["User:admin"]).start()
    errors = a.create_acls(bindings(count))
    assert not any(errors), [e for e in errors if e][:3]
    return a


def scenarios(topics: int) -> dict[str, tuple[KafkaPrincipal, list[Action], bool]]:
    """name -> (principal, the actions of one call, the expected decision of each)."""
    mid = topics // 2
    return {
        "literal-allow": (KafkaPrincipal("User", f"user-{mid}"),
                          [Action(Op.WRITE, RT.TOPIC, f"topic-{mid}")], True),
        "prefixed-allow": (KafkaPrincipal("User", "team-7"),
                           [Action(Op.READ, RT.TOPIC, "team-7.orders.eu-west")], True),
        "deny": (KafkaPrincipal("User", "blocked"),
                 [Action(Op.WRITE, RT.TOPIC, "topic-0")], False),
        "no-match": (KafkaPrincipal("User", "stranger"),
                     [Action(Op.READ, RT.TOPIC, f"topic-{mid}", log_if_denied=False)], False),
        "super-user": (KafkaPrincipal("User", "admin"),
                       [Action(Op.WRITE, RT.TOPIC, f"topic-{mid}")], True),
        "metadata-1000": (KafkaPrincipal("User", f"user-{mid}"), [
            Action(Op.DESCRIBE, RT.TOPIC, f"topic-{i % topics}", log_if_allowed=False,
                   log_if_denied=False) for i in range(1000)], False),
    }


def run(bindings_count: int, decisions: int, rounds: int) -> dict:
    logging.getLogger("kafka.authorizer.logger").setLevel(logging.WARNING)  # as with no log4j
    t0 = time.perf_counter()
    a = load(bindings_count)
    load_s = time.perf_counter() - t0
    topics = sum(1 for b in a.acls() if b.pattern.name.startswith("topic-")
                 and b.entry.operation == Op.WRITE and b.entry.permission_type == Perm.ALLOW)
    results = {}
    for name, (principal, actions, expected) in scenarios(topics).items():
        first = a.authorize(principal, "10.0.0.1", actions)
        if len(actions) == 1:
            assert first == [expected], (name, first)
        calls = max(1, decisions // len(actions))
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                a.authorize(principal, "10.0.0.1", actions)
            best = min(best, (time.perf_counter() - start) / (calls * len(actions)))
        results[name] = {"us_per_decision": best * 1e6, "decisions_per_s": 1 / best}
    return {"bindings": len(a.acls()), "resources": len(a._resources),
            "load_seconds": load_s, "scenarios": results}


def report(result: dict) -> str:
    lines = [f"{result['bindings']} bindings on {result['resources']} resources "
             f"(loaded in {result['load_seconds']:.2f} s)",
             f"{'scenario':<16} {'us/decision':>12} {'decisions/s':>14}"]
    for name, r in result["scenarios"].items():
        lines.append(f"{name:<16} {r['us_per_decision']:>12.2f} {r['decisions_per_s']:>14,.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bindings", type=int, default=10_000)
    p.add_argument("--decisions", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    result = run(args.bindings, args.decisions, args.rounds)
    print(report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
