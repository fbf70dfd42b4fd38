"""run.json written before tasks were packages still loads: status, compare and download of old runs.

Versions before the task packages stored a spec as one flat dict (every number a field, the
language tasks' own numbers under ``extra``, the rate rule under ``lr``). The documents below are
what such a version wrote (``mlbench run task3a 2 --data synthetic --set extra.hidden=64 --set
extra.bptt=35`` and ``mlbench run task1a 2 --set lr.milestones=50,75 --set momentum=0.5``); they
load into today's settings with the values they were run with.
"""

import json

from mlbench.results.mllog import mllog_lines
from mlbench.results.store import RunStore
from mlbench.run_config import RunDocument
from mlbench.tasks.records import spec_from_dict, spec_to_dict
from mlbench.tasks.registry import TASKS
from mlbench.tasks.spec import describe_task
from mlbench.tasks.task3a.settings import LanguageModelSettings
from mlbench.tasks.task4b import TASK4B

OLD_TASK3A_RUN = {'task': 'task3a',
 'division': 'open',
 'changed': ['extra.hidden', 'extra.bptt', 'data=synthetic'],
 'config': {'task': {'name': 'task3a',
                     'title': 'Language modelling: AWD-LSTM on Wikitext-2',
                     'model': 'awd-lstm',
                     'dataset': 'wikitext2',
                     'batch_per_worker': 20,
                     'lr': {'kind': 'sqrt-workers-seq-len',
                            'eta_per_sample': 0.0,
                            'warmup_epochs': 0.0,
                            'milestones': [],
                            'decay_factor': 10.0,
                            'alpha_by_workers': [],
                            'base': 15.0,
                            'warmup_steps': 0},
                     'momentum': 0.0,
                     'nesterov': False,
                     'weight_decay': 1.2e-06,
                     'l2': 0.0,
                     'max_epochs': 750,
                     'goal_full': 70.0,
                     'goal_light': 90.0,
                     'loss': 'cross-entropy',
                     'metric': 'perplexity',
                     'notes': 'validation perplexity, lower is better; averaged SGD after the non-monotone '
                              'trigger',
                     'reference': 'Merity et al. 2018 (AWD-LSTM, arXiv:1708.02182); MLBench task 3a',
                     'extra': {'eval_batch': 10,
                               'bptt': 35,
                               'asgd_lr': 15.0,
                               'grad_clip': 0.25,
                               'ar_alpha': 2.0,
                               'tar_beta': 1.0,
                               'nonmono': 5,
                               'embedding': 400,
                               'hidden': 64,
                               'layers': 3,
                               'dropout': 0.4,
                               'dropout_h': 0.2,
                               'dropout_i': 0.65,
                               'dropout_e': 0.1,
                               'weight_drop': 0.5},
                     'kind': 'training',
                     'runtime': 'language-model',
                     'optimizer': 'centralized-sgd'},
            'workers': 2,
            'backend': 'gloo',
            'device': 'cpu',
            'data': 'synthetic',
            'data_dir': None,
            'light': False,
            'stop_at_goal': True,
            'time_budget_s': None,
            'max_steps': None,
            'seed': 0,
            'log_every': 50,
            'timing': True,
            'threads_per_worker': 1,
            'optimizer': 'centralized-sgd',
            'optimizer_options': {},
            'save_model': False,
            'master_addr': '127.0.0.1',
            'master_port': 0,
            'eval_batch_size': 1000,
            'precision': 'fp32',
            'channels_last': False,
            'graph': True}}

OLD_TASK1A_RUN = {'task': 'task1a',
 'division': 'open',
 'changed': ['lr.milestones', 'momentum'],
 'config': {'task': {'name': 'task1a',
                     'title': 'Image classification: ResNet-20 on CIFAR-10',
                     'model': 'resnet20-v1',
                     'dataset': 'cifar10',
                     'batch_per_worker': 32,
                     'lr': {'kind': 'warmup-multistep',
                            'eta_per_sample': 0.000390625,
                            'warmup_epochs': 5,
                            'milestones': [50, 75],
                            'decay_factor': 10.0,
                            'alpha_by_workers': [],
                            'base': 0.0,
                            'warmup_steps': 0},
                     'momentum': 0.5,
                     'nesterov': True,
                     'weight_decay': 0.0001,
                     'l2': 0.0,
                     'max_epochs': 164,
                     'goal_full': 0.8,
                     'goal_light': 0.7,
                     'loss': 'cross-entropy',
                     'metric': 'accuracy',
                     'notes': '',
                     'reference': 'He et al. 2015 (ResNet); Goyal et al. 2017 (warm-up); MLBench task 1a',
                     'extra': {},
                     'kind': 'training',
                     'runtime': 'classification',
                     'optimizer': 'centralized-sgd'},
            'workers': 2,
            'backend': 'gloo',
            'device': 'cpu',
            'data': 'real',
            'data_dir': None,
            'light': False,
            'stop_at_goal': True,
            'time_budget_s': None,
            'max_steps': None,
            'seed': 0,
            'log_every': 50,
            'timing': True,
            'threads_per_worker': 1,
            'optimizer': 'centralized-sgd',
            'optimizer_options': {},
            'save_model': False,
            'master_addr': '127.0.0.1',
            'master_port': 0,
            'eval_batch_size': 1000,
            'precision': 'fp32',
            'channels_last': False,
            'graph': True}}

OLD_TASK4B_SPEC = {'name': 'task4b',
 'title': 'Machine translation: Transformer (big) on WMT17 en-de',
 'model': 'transformer-big',
 'dataset': 'wmt17-en-de',
 'batch_per_worker': 8192,
 'lr': {'kind': 'warmup-inverse-sqrt',
        'eta_per_sample': 0.0,
        'warmup_epochs': 0.0,
        'milestones': [],
        'decay_factor': 10.0,
        'alpha_by_workers': [],
        'base': 0.001976,
        'warmup_steps': 1000},
 'momentum': 0.0,
 'nesterov': False,
 'weight_decay': 0.0,
 'l2': 0.0,
 'max_epochs': 10,
 'goal_full': 25.0,
 'goal_light': 20.0,
 'loss': 'label-smoothed-cross-entropy',
 'metric': 'bleu',
 'notes': 'batch_per_worker counts tokens; BLEU on newstest2014 (sacreBLEU), beam 4, length penalty 0.6',
 'reference': 'Vaswani et al. 2017 (Transformer big, pre-norm); MLBench task 4b',
 'extra': {'adam': {'beta1': 0.9, 'beta2': 0.98, 'eps': 1e-09, 'lr_scale': 1.0},
           'global_tokens': 131072,
           'batch_multiple': 8,
           'max_len': 80,
           'label_smoothing': 0.1,
           'beam': 4,
           'length_penalty': 0.6,
           'dim': 1024,
           'ffn': 4096,
           'heads': 16,
           'encoder_layers': 6,
           'decoder_layers': 6,
           'dropout': 0.1,
           'attention_dropout': 0.1,
           'activation_dropout': 0.1},
 'kind': 'training',
 'runtime': 'translation',
 'optimizer': 'centralized-adam'}


def save(tmp_path, document):
    (tmp_path / "run.json").write_text(json.dumps(document), encoding="utf-8")
    return RunDocument.load(tmp_path)


def test_an_old_task3a_run_loads_with_its_own_numbers_as_settings(tmp_path):
    document = save(tmp_path, OLD_TASK3A_RUN)
    spec = document.config.training_spec
    assert spec.settings == LanguageModelSettings(hidden=64, bptt=35)
    assert (spec.metric, spec.goal_full, spec.optimizer) == ("perplexity", 70.0, "centralized-sgd")
    assert document.changed == ["extra.hidden", "extra.bptt", "data=synthetic"]
    assert ["hidden", 64] in describe_task(spec)


def test_an_old_task1a_run_loads_with_its_rate_rule_and_momentum(tmp_path):
    spec = save(tmp_path, OLD_TASK1A_RUN).config.training_spec
    assert spec.settings == TASKS["task1a"].settings.with_values({"lr.milestones": (50, 75), "momentum": 0.5})
    assert spec.lr.milestones == (50, 75) and spec.model == "resnet20-v1"


def test_an_old_task4b_spec_loads_with_adams_values():
    spec = spec_from_dict(OLD_TASK4B_SPEC)
    assert spec == TASK4B
    assert spec.settings.optimizer_values() == {"beta1": 0.9, "beta2": 0.98, "eps": 1e-9, "lr_scale": 1.0}


def test_every_task_round_trips_through_todays_format():
    for spec in TASKS.values():
        assert spec_from_dict(json.loads(json.dumps(spec_to_dict(spec)))) == spec


def test_the_mllog_export_of_an_old_run_has_its_hyper_parameters(tmp_path):
    store = RunStore()
    record = store.create(task="task1a", workers=2, division="open", run_json=OLD_TASK1A_RUN)
    lines = [json.loads(line.split(" ", 1)[1]) for line in
             mllog_lines(record, [], RunDocument.load(record.run_dir))]
    values = {line["key"]: line["value"] for line in lines}
    assert values["opt_learning_rate_decay_boundary_epochs"] == [50, 75]
    assert values["opt_momentum"] == 0.5 and values["global_batch_size"] == 64
