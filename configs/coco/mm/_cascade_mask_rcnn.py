# Cascade Mask R-CNN (Cai and Vasconcelos 2018) with an FPN on an InLine backbone, as in Swin's
# detection configs on mmdet 3.3.0's layout: the Mask R-CNN RPN, three box stages at IoU 0.5 /
# 0.6 / 0.7 (loss weights 1, 0.5, 0.25), each 4 shared convs (SyncBN) + 1 FC, class-agnostic
# boxes decoded for a GIoU loss (weight 10), a 4-conv mask head; 80 COCO classes. The model only:
# a variant's config adds a schedule (which brings the data and runtime of _coco_instance.py).
norm_cfg = dict(type="SyncBN", requires_grad=True)


def _stage(stds):
    return dict(
        type="ConvFCBBoxHead",
        num_shared_convs=4,
        num_shared_fcs=1,
        in_channels=256,
        conv_out_channels=256,
        fc_out_channels=1024,
        roi_feat_size=7,
        num_classes=80,
        bbox_coder=dict(type="DeltaXYWHBBoxCoder", target_means=[0.0] * 4, target_stds=stds),
        reg_class_agnostic=True,
        reg_decoded_bbox=True,
        norm_cfg=norm_cfg,
        loss_cls=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0),
        loss_bbox=dict(type="GIoULoss", loss_weight=10.0),
    )


def _rcnn(iou):
    return dict(
        assigner=dict(
            type="MaxIoUAssigner",
            pos_iou_thr=iou,
            neg_iou_thr=iou,
            min_pos_iou=iou,
            match_low_quality=False,
            ignore_iof_thr=-1,
        ),
        sampler=dict(type="RandomSampler", num=512, pos_fraction=0.25, neg_pos_ub=-1, add_gt_as_proposals=True),
        mask_size=28,
        pos_weight=-1,
        debug=False,
    )


model = dict(
    type="CascadeRCNN",
    data_preprocessor=dict(
        type="DetDataPreprocessor",
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_mask=True,
        pad_size_divisor=32,
    ),
    backbone=dict(type="InLineBackbone", name="inline_swin_tiny", drop_path_rate=0.2),
    neck=dict(type="FPN", in_channels=[96, 192, 384, 768], out_channels=256, num_outs=5),
    rpn_head=dict(
        type="RPNHead",
        in_channels=256,
        feat_channels=256,
        anchor_generator=dict(type="AnchorGenerator", scales=[8], ratios=[0.5, 1.0, 2.0], strides=[4, 8, 16, 32, 64]),
        bbox_coder=dict(type="DeltaXYWHBBoxCoder", target_means=[0.0] * 4, target_stds=[1.0] * 4),
        loss_cls=dict(type="CrossEntropyLoss", use_sigmoid=True, loss_weight=1.0),
        loss_bbox=dict(type="SmoothL1Loss", beta=1.0 / 9.0, loss_weight=1.0),
    ),
    roi_head=dict(
        type="CascadeRoIHead",
        num_stages=3,
        stage_loss_weights=[1, 0.5, 0.25],
        bbox_roi_extractor=dict(
            type="SingleRoIExtractor",
            roi_layer=dict(type="RoIAlign", output_size=7, sampling_ratio=0),
            out_channels=256,
            featmap_strides=[4, 8, 16, 32],
        ),
        bbox_head=[_stage([0.1, 0.1, 0.2, 0.2]), _stage([0.05, 0.05, 0.1, 0.1]), _stage([0.033, 0.033, 0.067, 0.067])],
        mask_roi_extractor=dict(
            type="SingleRoIExtractor",
            roi_layer=dict(type="RoIAlign", output_size=14, sampling_ratio=0),
            out_channels=256,
            featmap_strides=[4, 8, 16, 32],
        ),
        mask_head=dict(
            type="FCNMaskHead",
            num_convs=4,
            in_channels=256,
            conv_out_channels=256,
            num_classes=80,
            loss_mask=dict(type="CrossEntropyLoss", use_mask=True, loss_weight=1.0),
        ),
    ),
    train_cfg=dict(
        rpn=dict(
            assigner=dict(
                type="MaxIoUAssigner",
                pos_iou_thr=0.7,
                neg_iou_thr=0.3,
                min_pos_iou=0.3,
                match_low_quality=True,
                ignore_iof_thr=-1,
            ),
            sampler=dict(type="RandomSampler", num=256, pos_fraction=0.5, neg_pos_ub=-1, add_gt_as_proposals=False),
            allowed_border=0,
            pos_weight=-1,
            debug=False,
        ),
        rpn_proposal=dict(nms_pre=2000, max_per_img=2000, nms=dict(type="nms", iou_threshold=0.7), min_bbox_size=0),
        rcnn=[_rcnn(0.5), _rcnn(0.6), _rcnn(0.7)],
    ),
    test_cfg=dict(
        rpn=dict(nms_pre=1000, max_per_img=1000, nms=dict(type="nms", iou_threshold=0.7), min_bbox_size=0),
        rcnn=dict(score_thr=0.05, nms=dict(type="nms", iou_threshold=0.5), max_per_img=100, mask_thr_binary=0.5),
    ),
)
