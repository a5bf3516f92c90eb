"""qkv.train(...) and qkv.train.Run: the training run of `qkv train` (the library's train::TextRun) from Python.

The keyword options are `qkv train`'s, with config.json's names (`--batch-size 32` is batch_size=32):

    result = qkv.train(out="runs/copy", model="transformer", task="copy", steps=300, eval_every=100)
    run = qkv.train.Run(resume="runs/copy", steps=600)   # continues bit-exactly from the newest checkpoint
    run.train(on_step=lambda s: print(s["step"], s["loss"]))

A run trains in this process alone (data and context parallelism are `mpirun qkv train`'s). Ctrl-C, a callback that
raises or one that returns True stops the run after the current step's checkpoint; what was raised is raised then.
"""
from . import _qkv


class Run:
    """A run directory (config.json, vocab.txt, checkpoints/) with its data, model and optimizer.

    Run(out=DIR, **options) starts a new run in DIR; Run(resume=DIR, **options) continues the run in DIR from its
    newest checkpoint, where options may change the run lengths (steps, eval_every, eval_size, checkpoint_every,
    log_every, early_stop, keep_checkpoints) and the data (when it keeps the vocabulary); any other option must equal
    the saved one. Bad options raise ValueError (TypeError for a value that is not a str, int, float or bool).
    """

    def __init__(self, out=None, *, resume=None, **options):
        self._run = _qkv.TrainRun(out, resume, options)

    def train(self, on_step=None, on_eval=None):
        """Trains to config["steps"]: on_step({'step', 'loss', 'lr', 'tokens'}) after every step, on_eval({'step',
        'exact_match', 'token_accuracy', 'examples', 'tokens'}) after each periodic evaluation. Returns {'first_step',
        'step', 'loss', 'early_stopped', 'stopped', 'checkpoint', 'tokens'}."""
        return self._run.train(on_step, on_eval)

    def evaluate(self, limit=0):
        """Greedy decoding of the first `limit` test examples (all when 0): {'exact_match', 'token_accuracy',
        'examples', 'tokens'}."""
        return self._run.evaluate(limit)

    def stop(self):
        """Asks a train() running in another thread to stop after its current step's checkpoint."""
        self._run.stop()

    step = property(lambda self: self._run.step, doc="Optimizer steps done")
    config = property(lambda self: self._run.config, doc="config.json's settings, as {name: text}")
    dir = property(lambda self: self._run.dir, doc="The run directory")
    num_parameters = property(lambda self: self._run.num_parameters)
    resumed_from = property(lambda self: self._run.resumed_from, doc="The checkpoint resumed, or None")
    num_train = property(lambda self: self._run.num_train)
    num_test = property(lambda self: self._run.num_test)
    vocab_size = property(lambda self: self._run.vocab_size)


def train(out=None, *, resume=None, on_step=None, on_eval=None, **options):
    """Run(out, resume=resume, **options).train(on_step, on_eval): a new run in `out`, or the run in `resume`
    continued, trained to its `steps`. Returns train()'s result."""
    return Run(out, resume=resume, **options).train(on_step=on_step, on_eval=on_eval)


train.Run = Run
