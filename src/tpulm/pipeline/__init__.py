"""``tpulm run``: the generic stage engine (:mod:`~tpulm.pipeline.engine`) and tpulm's stages
wired for it (:mod:`~tpulm.pipeline.stages`), whose :func:`run` and :func:`plan` are this
package's face."""

from tpulm.pipeline.stages import RunConfig, RunPlan, RunResult, plan, run

__all__ = ["RunConfig", "RunPlan", "RunResult", "plan", "run"]
