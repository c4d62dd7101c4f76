# Semantic FPN on ADE20K (PVT's recipe, as configs/ade20k/_semantic_fpn.yaml): 16 images per
# iteration (2 per GPU x 8), AdamW lr 2e-4, weight decay 1e-4 (none on norms, biases, position
# embeddings), poly 0.9 over 40k iterations.
_base_ = ["./_ade20k.py"]
norm_cfg = dict(type="SyncBN", requires_grad=True)
model = dict(
    type="EncoderDecoder",
    data_preprocessor=dict(
        type="SegDataPreProcessor",
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_val=0,
        seg_pad_val=255,
        size=(512, 512),
    ),
    backbone=dict(type="InLineBackbone", name="inline_pvt_tiny", drop_path_rate=0.1),
    neck=dict(type="FPN", in_channels=[64, 128, 320, 512], out_channels=256, num_outs=4),
    decode_head=dict(
        type="FPNHead",
        in_channels=[256, 256, 256, 256],
        in_index=[0, 1, 2, 3],
        feature_strides=[4, 8, 16, 32],
        channels=128,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0),
    ),
    train_cfg=dict(),
    test_cfg=dict(mode="whole"),
)
optim_wrapper = dict(
    type="OptimWrapper",
    optimizer=dict(type="AdamW", lr=2e-4, betas=(0.9, 0.999), weight_decay=1e-4),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        custom_keys={
            "pos_embed": dict(decay_mult=0.0),
            "cls_token": dict(decay_mult=0.0),
            "relative_position_bias_table": dict(decay_mult=0.0),
        },
    ),
)
param_scheduler = [dict(type="PolyLR", power=0.9, eta_min=0.0, begin=0, end=40000, by_epoch=False)]
train_cfg = dict(type="IterBasedTrainLoop", max_iters=40000, val_interval=4000)
default_hooks = dict(
    timer=dict(type="IterTimerHook"),
    logger=dict(type="LoggerHook", interval=50, log_metric_by_epoch=False),
    param_scheduler=dict(type="ParamSchedulerHook"),
    checkpoint=dict(type="CheckpointHook", by_epoch=False, interval=4000),
    sampler_seed=dict(type="DistSamplerSeedHook"),
    visualization=dict(type="SegVisualizationHook"),
)
