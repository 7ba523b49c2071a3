"""fl_algorithms.choices: the option names the parsers read are the ones the library implements."""
import subprocess
import sys

from fl_algorithms import choices


def test_choices_imports_nothing():
    code = "import sys; import fl_algorithms.choices; print(sorted(m for m in sys.modules if m.startswith(('torch', 'numpy'))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_the_names_kept_twice_agree():
    from fl_algorithms.engine.sim import RunConfig
    from fl_algorithms.training.adapter_trainer import FEDMCP_PROTOCOLS
    from nlp_models.backbone import BACKBONES
    from secagg.protocols import registry

    assert BACKBONES == choices.BACKBONES  # nlp_models sits below fl_algorithms
    assert tuple(FEDMCP_PROTOCOLS) == choices.FEDMCP_TRAINING_PROTOCOLS
    assert set(choices.SECURE_PROTOCOLS) == set(registry.names()) - {"plain"}
    for backend in choices.BACKENDS:
        assert RunConfig(backend=backend).backend == backend
