"""Start and stop real SGLang deployments on 127.0.0.1 (used by tests, benchmarks and the demo).

    with PDDeployment(DeploymentConfig(page_size=16, with_plain=True)) as dep:
        out = dep.generate_pd(prompt_ids)          # paired through a bootstrap room
        ref = dep.generate(dep.plain, prompt_ids)  # same prompt on a plain server
"""

from sglang_pd.harness.deployment import DeploymentConfig, PDDeployment
from sglang_pd.harness.server import ServerProcess, ServerStartError

__all__ = ["DeploymentConfig", "PDDeployment", "ServerProcess", "ServerStartError"]
