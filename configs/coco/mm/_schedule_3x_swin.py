# The paper's 3x recipe for InLine-Swin (Swin's): AdamW lr 1e-4, betas (0.9, 0.999), weight decay
# 0.05 (none on norms, position embeddings and relative-position tables), 36 epochs of 16 images
# per iteration, lr x 0.1 after epochs 27 and 33, linear warm-up over 1000 iterations from 0.001 x
# lr; multi-scale training: the short side drawn from 480-800 (step 32, long side <= 1333), or
# (Swin's AutoAugment branch) a resize to 400-600, a random crop of 384-600 and the same
# multi-scale resize.
_base_ = ["./_coco_instance.py"]
multi_scale = [(1333, s) for s in range(480, 801, 32)]
train_pipeline = [
    dict(type="LoadImageFromFile", backend_args=None),
    dict(type="LoadAnnotations", with_bbox=True, with_mask=True),
    dict(type="RandomFlip", prob=0.5),
    dict(
        type="RandomChoice",
        transforms=[
            [dict(type="RandomChoiceResize", scales=multi_scale, keep_ratio=True)],
            [
                dict(type="RandomChoiceResize", scales=[(4200, 400), (4200, 500), (4200, 600)], keep_ratio=True),
                dict(type="RandomCrop", crop_type="absolute_range", crop_size=(384, 600), allow_negative_crop=True),
                dict(type="RandomChoiceResize", scales=multi_scale, keep_ratio=True),
            ],
        ],
    ),
    dict(type="PackDetInputs"),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
optim_wrapper = dict(
    type="OptimWrapper",
    optimizer=dict(type="AdamW", lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        custom_keys={
            "absolute_pos_embed": dict(decay_mult=0.0),
            "relative_position_bias_table": dict(decay_mult=0.0),
            "norm": dict(decay_mult=0.0),
        }
    ),
)
param_scheduler = [
    dict(type="LinearLR", start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type="MultiStepLR", begin=0, end=36, by_epoch=True, milestones=[27, 33], gamma=0.1),
]
train_cfg = dict(type="EpochBasedTrainLoop", max_epochs=36, val_interval=1)
