"""The SAT core: Algorithm 1 as pure JAX over any agents (no LM knowledge).

Modules: `agent` (protocol, AgentState, team state), `batch` (team batch),
`advantage`, `objective` (loss and jitted update), `trust_region`, `order`,
`certificate`, `config` (SATConfig), `stage` (the stage loop and baselines).
"""

from sat_jax.core.agent import Agent
from sat_jax.core.agent import AgentState
from sat_jax.core.agent import init_team
from sat_jax.core.agent import team_params
from sat_jax.core.agent import TeamState
from sat_jax.core.batch import AgentView
from sat_jax.core.batch import TeamBatch
from sat_jax.core.config import CertificateConfig
from sat_jax.core.config import OptimizerConfig
from sat_jax.core.config import SATConfig
from sat_jax.core.config import UpdateConfig
from sat_jax.core.stage import run_stage
from sat_jax.core.stage import StageRecord
