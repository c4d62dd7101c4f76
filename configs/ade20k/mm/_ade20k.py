# ADE20K for mmsegmentation 1.2.2 with the InLine backbones (inline_attn.dense.mm): mmseg's own
# ADE20K pipeline and runtime, self-contained (no files of mmseg's repository needed).
# Train: python tools/train.py configs/ade20k/mm/semantic_fpn_inline_pvt_tiny.py  (mmseg's script,
#        or mmengine's Runner.from_cfg), with data_root pointing at ADEChallengeData2016.
custom_imports = dict(imports=["inline_attn.dense.mm"], allow_failed_imports=False)
default_scope = "mmseg"
dataset_type = "ADE20KDataset"
data_root = "data/ade/ADEChallengeData2016"
crop_size = (512, 512)
train_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(type="LoadAnnotations", reduce_zero_label=True),
    dict(type="RandomResize", scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type="RandomCrop", crop_size=crop_size, cat_max_ratio=0.75),
    dict(type="RandomFlip", prob=0.5),
    dict(type="PhotoMetricDistortion"),
    dict(type="PackSegInputs"),
]
test_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(type="Resize", scale=(2048, 512), keep_ratio=True),
    dict(type="LoadAnnotations", reduce_zero_label=True),
    dict(type="PackSegInputs"),
]
train_dataloader = dict(
    batch_size=2,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type="InfiniteSampler", shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path="images/training", seg_map_path="annotations/training"),
        pipeline=train_pipeline,
    ),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type="DefaultSampler", shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path="images/validation", seg_map_path="annotations/validation"),
        pipeline=test_pipeline,
    ),
)
test_dataloader = val_dataloader
val_evaluator = dict(type="IoUMetric", iou_metrics=["mIoU"])
test_evaluator = val_evaluator

env_cfg = dict(
    cudnn_benchmark=True, mp_cfg=dict(mp_start_method="fork", opencv_num_threads=0), dist_cfg=dict(backend="nccl")
)
vis_backends = [dict(type="LocalVisBackend")]
visualizer = dict(type="SegLocalVisualizer", vis_backends=vis_backends, name="visualizer")
log_processor = dict(by_epoch=False)
log_level = "INFO"
load_from = None
resume = False
tta_model = dict(type="SegTTAModel")
val_cfg = dict(type="ValLoop")
test_cfg = dict(type="TestLoop")
